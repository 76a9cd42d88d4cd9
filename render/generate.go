package render

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"

	"sigs.k8s.io/kustomize/api/konfig"
	"sigs.k8s.io/kustomize/api/types"
)

// generateKustomization writes a kustomization file into dir, which has
// none, and returns its path. Like Flux's generator it lists every *.yaml
// and *.yml file below dir, except that a subdirectory with a kustomization
// file of its own is listed as a directory and not looked into. Unlike
// Flux, hidden files and directories (".github", ".sops.yaml") are left
// out: they are tooling, not manifests.
func (a *artifact) generateKustomization(dir string) (string, error) {
	var resources []string
	listed := map[string]bool{}
	for _, f := range a.filesBelow(dir) {
		rel := strings.TrimPrefix(f, dir+"/")
		if dir == "." {
			rel = f
		}
		parts := strings.Split(rel, "/")
		if hidden(parts) {
			continue
		}
		// The topmost directory on the way to f that has a kustomization
		// stands for everything below it.
		entry := ""
		for i := 1; i < len(parts); i++ {
			sub := path.Join(dir, path.Join(parts[:i]...))
			if k, _ := a.kustomizationFile(sub); k != "" || a.hasKustomizationError(sub) {
				entry = path.Join(parts[:i]...)
				break
			}
		}
		if entry == "" && !a.unsupportedDirs[f] {
			if ext := path.Ext(f); ext != ".yaml" && ext != ".yml" {
				continue
			}
			entry = rel
		}
		if !listed[entry] {
			listed[entry] = true
			resources = append(resources, "./"+entry)
		}
	}
	k := struct {
		APIVersion    string   `json:"apiVersion"`
		Kind          string   `json:"kind"`
		Resources     []string `json:"resources"`
		BuildMetadata []string `json:"buildMetadata,omitempty"`
	}{
		APIVersion: types.KustomizationVersion,
		Kind:       types.KustomizationKind,
		Resources:  resources,
	}
	if len(resources) == 0 {
		// Most likely a wrong path; rendering nothing would let the
		// reconciler prune everything.
		return "", &Error{File: dir, Err: errors.New("no kustomization file and no YAML files to generate one from")}
	}
	// JSON is YAML, and json.Marshal quotes whatever needs quoting.
	data, err := json.Marshal(k)
	if err != nil {
		return "", fmt.Errorf("generate kustomization for %s: %w", dir, err)
	}
	kfile := path.Join(dir, konfig.DefaultKustomizationFileName())
	if err := a.write(kfile, data); err != nil {
		return "", &Error{File: kfile, Err: fmt.Errorf("generate kustomization: %w", err)}
	}
	a.generated[kfile] = true
	return kfile, nil
}

// hasKustomizationError says whether dir has more than one kustomization
// file; it is listed like one with a single file, and the check then
// reports the ambiguity.
func (a *artifact) hasKustomizationError(dir string) bool {
	_, err := a.kustomizationFile(dir)
	return err != nil
}

// hidden says whether a path has a component starting with a dot.
func hidden(parts []string) bool {
	for _, p := range parts {
		if strings.HasPrefix(p, ".") {
			return true
		}
	}
	return false
}

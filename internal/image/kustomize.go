package image

import (
	"fmt"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// SetKustomizeImage points the images entry called imageName of the
// kustomization file at path to ref (REPO:TAG or REPO@DIGEST), as
// `kustomize edit set image` does, keeping the file's comments and order.
func SetKustomizeImage(path, imageName, ref string) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("set image in %s: reference %q: %w", path, ref, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("set image: %w", err)
	}
	node, err := yaml.Parse(string(data))
	if err != nil {
		return fmt.Errorf("set image: %s: %w", path, err)
	}
	images, err := node.Pipe(yaml.LookupCreate(yaml.SequenceNode, "images"))
	if err != nil {
		return fmt.Errorf("set image: %s: images: %w", path, err)
	}
	entry, err := images.Pipe(yaml.ElementMatcher{Keys: []string{"name"}, Values: []string{imageName}, Create: yaml.NewMapRNode(&map[string]string{"name": imageName})})
	if err != nil {
		return fmt.Errorf("set image: %s: images[name=%s]: %w", path, imageName, err)
	}
	repo := r.Context().Name()
	if strings.HasPrefix(repo, name.DefaultRegistry+"/") && !strings.HasPrefix(ref, name.DefaultRegistry) {
		// Keep "org/app" as written, not "index.docker.io/org/app".
		repo = strings.TrimPrefix(repo, name.DefaultRegistry+"/")
	}
	fields := map[string]string{"newName": repo}
	switch r := r.(type) {
	case name.Digest:
		fields["digest"] = r.DigestStr()
		_ = entry.PipeE(yaml.Clear("newTag"))
	case name.Tag:
		fields["newTag"] = r.TagStr()
		_ = entry.PipeE(yaml.Clear("digest"))
	}
	for k, v := range fields {
		if err := entry.PipeE(yaml.SetField(k, yaml.NewStringRNode(v))); err != nil {
			return fmt.Errorf("set image: %s: %s: %w", path, k, err)
		}
	}
	out, err := node.String()
	if err != nil {
		return fmt.Errorf("set image: %s: %w", path, err)
	}
	return os.WriteFile(path, []byte(out), 0o644)
}

package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// crdFieldManager owns the fields InstallCRDs applies.
const crdFieldManager = "capstan-testenv"

// crdDoc is one CustomResourceDefinition read from a file, as JSON.
type crdDoc struct {
	source string // file and document number, for errors
	name   string
	json   []byte
}

// InstallCRDs server-side applies every CustomResourceDefinition found in
// paths and waits until each is Established and served by discovery, so a
// RESTMapper finds it. A path is a YAML or JSON file, or a directory whose
// *.yaml, *.yml and *.json files are read (not recursively). Files may hold
// many documents; documents of other kinds are skipped. ctx should carry a
// deadline: a CRD that is accepted but never established is waited for
// until ctx is done.
func InstallCRDs(ctx context.Context, cfg *rest.Config, paths ...string) error {
	docs, err := readCRDs(paths)
	if err != nil {
		return err
	}
	return installCRDDocs(ctx, cfg, docs)
}

// installCRDDocs applies the CRDs and waits until each is served.
func installCRDDocs(ctx context.Context, cfg *rest.Config, docs []crdDoc) error {
	client, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("install CRDs: create client: %w", err)
	}
	crds := client.ApiextensionsV1().CustomResourceDefinitions()
	force := true
	for _, d := range docs {
		_, err := crds.Patch(ctx, d.name, types.ApplyPatchType, d.json, metav1.PatchOptions{FieldManager: crdFieldManager, Force: &force})
		if err != nil {
			return fmt.Errorf("apply CustomResourceDefinition/%s from %s: %w", d.name, d.source, err)
		}
	}
	for _, d := range docs {
		if err := waitCRDServed(ctx, client, d.name); err != nil {
			return fmt.Errorf("wait for CustomResourceDefinition/%s from %s: %w", d.name, d.source, err)
		}
	}
	return nil
}

// waitCRDServed waits until the CRD is Established and discovery lists its
// resource in every served version.
func waitCRDServed(ctx context.Context, client apiextensionsclient.Interface, name string) error {
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	var last error
	for {
		done, err := crdServed(ctx, client, name)
		if done {
			return nil
		}
		var stalled *stalledError
		if errors.As(err, &stalled) {
			return err
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), last)
		case <-ticker.C:
		}
	}
}

// stalledError is a CRD condition that waiting will not change.
type stalledError struct{ reason, message string }

func (e *stalledError) Error() string { return e.reason + ": " + e.message }

// crdServed reports whether the CRD is established and discoverable. The
// error says what it is still waiting for, or is a *stalledError.
func crdServed(ctx context.Context, client apiextensionsclient.Interface, name string) (bool, error) {
	crd, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	established := false
	for _, c := range crd.Status.Conditions {
		switch {
		case c.Type == apiextensionsv1.NamesAccepted && c.Status == apiextensionsv1.ConditionFalse:
			return false, &stalledError{reason: c.Reason, message: c.Message}
		case c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue:
			established = true
		}
	}
	if !established {
		return false, errors.New("not Established yet")
	}
	for _, v := range crd.Spec.Versions {
		if !v.Served {
			continue
		}
		gv := crd.Spec.Group + "/" + v.Name
		list, err := client.Discovery().ServerResourcesForGroupVersion(gv)
		if err != nil && !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("discover %s: %w", gv, err)
		}
		if list == nil || !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool {
			return r.Name == crd.Spec.Names.Plural
		}) {
			return false, fmt.Errorf("%s/%s not in discovery yet", gv, crd.Spec.Names.Plural)
		}
	}
	return true, nil
}

// readCRDs reads the CRDs in paths, reporting every unreadable file or
// malformed document together.
func readCRDs(paths []string) ([]crdDoc, error) {
	var files []string
	var errs []error
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("read CRDs: %w", err))
			continue
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("read CRDs: %w", err))
			continue
		}
		for _, e := range entries { // sorted by name
			switch strings.ToLower(filepath.Ext(e.Name())) {
			case ".yaml", ".yml", ".json":
				if !e.IsDir() {
					files = append(files, filepath.Join(p, e.Name()))
				}
			}
		}
	}
	var docs []crdDoc
	for _, f := range files {
		d, err := readCRDFile(f)
		docs = append(docs, d...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return docs, errors.Join(errs...)
}

// readCRDFile returns the CRDs among the documents of one file.
func readCRDFile(path string) ([]crdDoc, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read CRDs: %w", err)
	}
	defer f.Close()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var docs []crdDoc
	var errs []error
	for i := 1; ; i++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		source := fmt.Sprintf("%s (document %d)", path, i)
		if err != nil {
			errs = append(errs, fmt.Errorf("read CRDs from %s: %w", source, err))
			break
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		d, ok, err := parseCRD(raw)
		if err != nil {
			errs = append(errs, fmt.Errorf("read CRDs from %s: %w", source, err))
			continue
		}
		if ok {
			d.source = source
			docs = append(docs, d)
		}
	}
	return docs, errors.Join(errs...)
}

// parseCRD converts one YAML or JSON document to JSON without its status.
// ok is false for documents that are not CRDs, including empty ones.
func parseCRD(raw []byte) (d crdDoc, ok bool, err error) {
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return crdDoc{}, false, err
	}
	var obj map[string]any
	if err := json.Unmarshal(js, &obj); err != nil || obj == nil {
		// Comments only, or a scalar: not an object, not a CRD.
		return crdDoc{}, false, nil
	}
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	if kind != "CustomResourceDefinition" || !strings.HasPrefix(apiVersion, apiextensionsv1.GroupName+"/") {
		return crdDoc{}, false, nil
	}
	if apiVersion != apiextensionsv1.SchemeGroupVersion.String() {
		return crdDoc{}, false, fmt.Errorf("CustomResourceDefinition in %s, only %s is served", apiVersion, apiextensionsv1.SchemeGroupVersion)
	}
	meta, _ := obj["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	if name == "" {
		return crdDoc{}, false, errors.New("CustomResourceDefinition without metadata.name")
	}
	// Status in a manifest (controller-gen writes an empty one) is not ours
	// to apply.
	delete(obj, "status")
	if js, err = json.Marshal(obj); err != nil {
		return crdDoc{}, false, fmt.Errorf("encode CustomResourceDefinition/%s: %w", name, err)
	}
	return crdDoc{name: name, json: js}, true, nil
}

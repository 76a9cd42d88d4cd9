package render

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"testing"
	"testing/fstest"
)

// plainCases are overlays whose kustomization is plain, or nearly: each
// is built by buildPlain (where it applies) and by kustomize, and the two
// must agree to the byte, errors included.
var plainCases = map[string]struct {
	files fstest.MapFS
	// plain says whether buildPlain builds it (false: it gives up, or the
	// kustomization is not plain, and kustomize builds it).
	plain bool
}{
	"many ConfigMaps, substituted": {files: configMapOverlay(50), plain: true},
	"every ordered kind, out of order, in two files": {plain: true, files: fstest.MapFS{
		"o/kustomization.yaml": {Data: []byte("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- b.yaml\n- sub/a.yaml\n")},
		"o/b.yaml": {Data: []byte(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: vwc}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: b}
spec: {replicas: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: b}
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: w, namespace: default}
spec: {size: 3, enabled: true, mode: "0755", none: null}
---
apiVersion: example.com/v1
kind: Namespace
metadata: {name: custom-ns}
---
apiVersion: v1
kind: Namespace
metadata: {name: b}
`)},
		"o/sub/a.yaml": {Data: []byte(`# a comment
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
---
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: reader
  annotations: {config.kubernetes.io/origin: "path: forged.yaml", keep: "yes"}
rules: []
---
apiVersion: v1
kind: ConfigMap
metadata: {name: a}
data:
  multi: |
    line one
    line two
  anchored: &v shared
  aliased: *v
  number: "12"
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: w}
---
apiVersion: v1
kind: Secret
metadata: {name: s, namespace: b}
stringData: {k: v}
`)},
	}},
	"a List, local configs": {plain: true, files: fstest.MapFS{
		"o/kustomization.yaml": {Data: []byte("resources: [list.yaml]\n")},
		"o/list.yaml": {Data: []byte(`apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: one, namespace: x}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: two, namespace: x, annotations: {config.kubernetes.io/local-config: "true"}}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: three, namespace: x, annotations: {config.kubernetes.io/local-config: "false"}}
`)},
	}},
	"origin annotations asked for": {plain: true, files: fstest.MapFS{
		"o/kustomization.yaml": {Data: []byte("buildMetadata: [originAnnotations]\nresources: [a.yaml]\n")},
		"o/a.yaml":             {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: x}\n")},
	}},
	"generated kustomization": {plain: true, files: fstest.MapFS{
		"o/b.yaml": {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b, namespace: x}\n")},
		"o/a.yml":  {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: x}\n")},
	}},
	"duplicate across files": {files: fstest.MapFS{
		"o/kustomization.yaml": {Data: []byte("resources: [a.yaml, b.yaml]\n")},
		"o/a.yaml":             {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")},
		"o/b.yaml":             {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: default}\n")},
	}},
	"object without a name": {files: fstest.MapFS{
		"o/kustomization.yaml": {Data: []byte("resources: [a.yaml]\n")},
		"o/a.yaml":             {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: x}\n")},
	}},
	"a base directory is not plain": {files: fstest.MapFS{
		"o/kustomization.yaml":      {Data: []byte("resources: [base]\n")},
		"o/base/kustomization.yaml": {Data: []byte("resources: [a.yaml]\n")},
		"o/base/a.yaml":             {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: x}\n")},
	}},
	"a namespace field is not plain": {files: fstest.MapFS{
		"o/kustomization.yaml": {Data: []byte("namespace: y\nresources: [a.yaml]\n")},
		"o/a.yaml":             {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: x}\n")},
	}},
}

// TestPlainBuildMatchesKustomize holds buildPlain to kustomize's output:
// the same objects in the same order, the same files, the same errors.
func TestPlainBuildMatchesKustomize(t *testing.T) {
	for name, tc := range plainCases {
		t.Run(name, func(t *testing.T) {
			opts := Options{Path: "o", Substitute: map[string]string{"NS": "ns"}}
			if _, ok := tc.files["staged/kustomization.yaml"]; ok {
				opts.Path = "staged"
			}
			fast, fastErr := BuildResult(context.Background(), tc.files, opts)
			plainBuilds = false
			slow, slowErr := BuildResult(context.Background(), tc.files, opts)
			plainBuilds = true
			if fmt.Sprint(fastErr) != fmt.Sprint(slowErr) {
				t.Fatalf("errors differ:\nplain:     %v\nkustomize: %v", fastErr, slowErr)
			}
			if slowErr != nil {
				return
			}
			if got, want := string(marshalObjects(t, fast.Objects)), string(marshalObjects(t, slow.Objects)); got != want {
				t.Errorf("objects differ:\nplain:\n%s\nkustomize:\n%s", got, want)
			}
			if got, want := strings.Join(fast.Files, ","), strings.Join(slow.Files, ","); got != want {
				t.Errorf("files differ:\nplain:     %s\nkustomize: %s", got, want)
			}
			if got := plainTaken(t, tc.files, opts.Path); got != tc.plain {
				t.Errorf("built without kustomize: %v, want %v", got, tc.plain)
			}
		})
	}
}

// plainTaken reports whether buildPlain builds the overlay at p.
func plainTaken(t *testing.T, fsys fstest.MapFS, p string) bool {
	t.Helper()
	opts, err := Options{Path: p}.normalize()
	if err != nil {
		t.Fatal(err)
	}
	a, err := indexArtifact(context.Background(), fsys, opts)
	if err != nil {
		t.Fatal(err)
	}
	kfile, err := a.kustomizationFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if kfile == "" {
		if kfile, err = a.generateKustomization(p); err != nil {
			t.Fatal(err)
		}
	}
	pl, err := check(context.Background(), a, p, kfile, opts)
	if err != nil || pl.plain == nil {
		return false
	}
	_, ok := buildPlain(a, p, pl.plain)
	return ok
}

// TestPlainBuildMatchesKustomizeOnTheTestdata builds every overlay of the
// test artifacts both ways; the broken ones must fail alike.
func TestPlainBuildMatchesKustomizeOnTheTestdata(t *testing.T) {
	for _, artifact := range []string{"testdata/repo", "testdata/bad"} {
		fsys := os.DirFS(artifact)
		err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() || p == "." {
				return err
			}
			t.Run(artifact+"/"+p, func(t *testing.T) {
				opts := DefaultOptions()
				opts.Path = p
				fast, fastErr := BuildResult(context.Background(), fsys, opts)
				plainBuilds = false
				slow, slowErr := BuildResult(context.Background(), fsys, opts)
				plainBuilds = true
				if fmt.Sprint(fastErr) != fmt.Sprint(slowErr) {
					t.Fatalf("errors differ:\nplain:     %v\nkustomize: %v", fastErr, slowErr)
				}
				if slowErr == nil && string(marshalObjects(t, fast.Objects)) != string(marshalObjects(t, slow.Objects)) {
					t.Errorf("objects differ")
				}
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

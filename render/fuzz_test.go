package render

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// FuzzBuild feeds arbitrary kustomization and resource contents to Build
// and LoadManifests. Whatever the input, they must return (an error or
// well-formed objects) without panicking or hanging. The seed corpus under
// testdata/fuzz/FuzzBuild holds hostile inputs: alias bombs, exponential
// bases, path traversal, remote bases, exec plugins, deep nesting.
func FuzzBuild(f *testing.F) {
	f.Add([]byte("resources: [res.yaml, ../base]\nnamePrefix: x-\n"), []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  v: ${VAR}\n"))
	f.Fuzz(func(t *testing.T, kustomization, resource []byte) {
		fsys := fstest.MapFS{
			"app/kustomization.yaml":     {Data: kustomization},
			"app/res.yaml":               {Data: resource},
			"app/sub/kustomization.yaml": {Data: []byte("resources: [../res.yaml]\n")},
			"base/kustomization.yaml":    {Data: []byte("resources: [cm.yaml]\n")},
			"base/cm.yaml":               {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: base\n")},
			"plain/res.yaml":             {Data: resource},
			"plain/kustomization.yaml":   {Data: kustomization},
		}
		opts := DefaultOptions()
		opts.Path = "app"
		opts.Substitute = map[string]string{"VAR": "a: [b"}
		opts.MaxBytes = 1 << 20
		opts.MaxObjects = 1000
		objs, err := Build(context.Background(), fsys, opts)
		if err == nil {
			checkObjects(t, objs)
		}
		objs, err = LoadManifests(fsys, "plain", nil)
		checkObjects(t, objs)
		_ = err
	})
}

// checkObjects fails unless every object has an identity and holds only
// values that the API machinery can copy and serialise.
func checkObjects(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, obj := range objs {
		if obj.GetAPIVersion() == "" || obj.GetKind() == "" || obj.GetName() == "" {
			t.Errorf("object without identity: %v", obj.Object)
		}
		_ = obj.DeepCopy() // panics on values that are not JSON types
		if _, err := yaml.Marshal(obj.Object); err != nil {
			t.Errorf("%s does not marshal: %v", objectNameOf(obj), err)
		}
	}
}

// FuzzBuildReadLimits feeds files of any content and any reported size
// to Build under small limits: whatever the listing says, Build never
// reads more than a limit (plus the byte that tells it broke one) from any
// file, nor from the artifact in total, and it never reads a file no
// kustomization reaches.
func FuzzBuildReadLimits(f *testing.F) {
	f.Add([]byte("resources: [res.yaml]\n"), []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n"), int64(10), uint16(64), uint16(200))
	f.Add([]byte("resources: [res.yaml, res.yaml]\n"), []byte(strings.Repeat("a: b\n", 100)), int64(-1), uint16(0), uint16(0))
	f.Fuzz(func(t *testing.T, kustomization, resource []byte, reported int64, maxFile, maxTotal uint16) {
		m := fstest.MapFS{
			"app/kustomization.yaml": {Data: kustomization},
			"app/res.yaml":           {Data: resource},
			"unrelated/big.yaml":     {Data: resource},
		}
		src := newOpenCounter(m)
		src.lies["app/res.yaml"] = reported
		opts := DefaultOptions()
		opts.Path = "app"
		opts.MaxFileBytes = int64(maxFile) + 1
		opts.MaxBytes = int64(maxTotal) + 1
		objs, err := Build(context.Background(), src, opts)
		if err == nil {
			checkObjects(t, objs)
		}
		if src.opened["unrelated/big.yaml"] != 0 {
			t.Fatal("read a file no kustomization reaches")
		}
		files := int64(len(src.opened))
		if src.read > opts.MaxBytes+files {
			t.Fatalf("read %d bytes from %d files, over the limit of %d", src.read, files, opts.MaxBytes)
		}
	})
}

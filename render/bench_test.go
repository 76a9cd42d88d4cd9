package render

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/fstest"
)

// configMapOverlay is an overlay of n ConfigMaps in one file, labelled
// into five stages: the push-to-Ready benchmark's input (e2e).
func configMapOverlay(n int) fstest.MapFS {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-%04d\n  namespace: ${NS}\n  labels: {capstan.dev/stage: S%d}\ndata: {index: \"%d\", payload: some configuration}\n",
			i, i*5/n+1, i)
	}
	return fstest.MapFS{
		"staged/kustomization.yaml": {Data: []byte("resources: [objects.yaml]\n")},
		"staged/objects.yaml":       {Data: []byte(b.String())},
	}
}

// BenchmarkBuild1000ConfigMaps renders 1,000 ConfigMaps and substitutes
// them, as a reconcile of the push-to-Ready benchmark does (e2e), with
// kustomize and with buildPlain.
func BenchmarkBuild1000ConfigMaps(b *testing.B) {
	fsys := configMapOverlay(1000)
	opts := Options{Path: "staged", Substitute: map[string]string{"NS": "bench"}}
	for _, plain := range []bool{false, true} {
		b.Run(fmt.Sprintf("plain=%v", plain), func(b *testing.B) {
			plainBuilds = plain
			defer func() { plainBuilds = true }()
			for b.Loop() {
				objs, err := Build(context.Background(), fsys, opts)
				if err != nil {
					b.Fatal(err)
				}
				if len(objs) != 1000 {
					b.Fatalf("rendered %d objects, want 1000", len(objs))
				}
			}
		})
	}
}

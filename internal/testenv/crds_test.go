package testenv

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

var widgets = schema.GroupVersionResource{Group: "testenv.capstan.dev", Version: "v1alpha1", Resource: "widgets"}

// TestInstalledCRDServesObjects uses the CRD that Start installed from
// testdata/crds: valid objects are stored, the schema rejects invalid ones.
func TestInstalledCRDServesObjects(t *testing.T) {
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	client := dynamic.NewForConfigOrDie(env.Config).Resource(widgets).Namespace(ns)
	widget := func(name string, size int64) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "testenv.capstan.dev/v1alpha1",
			"kind":       "Widget",
			"metadata":   map[string]any{"name": name},
			"spec":       map[string]any{"size": size},
		}}
	}
	begin := time.Now()
	if _, err := client.Create(ctx, widget("big", 3), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Widget: %v", err)
	}
	t.Logf("first Widget created in %s", time.Since(begin))
	got, err := client.Get(ctx, "big", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Widget: %v", err)
	}
	if size, _, _ := unstructured.NestedInt64(got.Object, "spec", "size"); size != 3 {
		t.Errorf("Widget spec.size = %d, want 3", size)
	}
	if _, err := client.Create(ctx, widget("none", 0), metav1.CreateOptions{}); err == nil {
		t.Error("Widget with size 0 was accepted, the CRD schema says minimum 1")
	}
}

// TestInstallCRDsAgain applies the same CRDs a second time, as a test
// package that reinstalls them after a change would.
func TestInstallCRDsAgain(t *testing.T) {
	if err := InstallCRDs(t.Context(), env.Config, "testdata/crds/widgets.yaml"); err != nil {
		t.Fatal(err)
	}
}

// TestInstallCRDsRejects pins which files InstallCRDs refuses, before it
// applies anything.
func TestInstallCRDsRejects(t *testing.T) {
	tests := []struct {
		name string
		path string
		want []string // all in the error
	}{
		{"missing path", "testdata/nope", []string{"testdata/nope", "no such file"}},
		{"v1beta1 CRD", "testdata/bad/v1beta1.yaml", []string{"v1beta1.yaml (document 1)", "only apiextensions.k8s.io/v1"}},
		{"CRD without a name", "testdata/bad/noname.yaml", []string{"noname.yaml (document 2)", "without metadata.name"}},
		{"malformed YAML", "testdata/bad/broken.yaml", []string{"broken.yaml (document 1)"}},
		{"every bad file of a directory at once", "testdata/bad", []string{"v1beta1.yaml", "noname.yaml", "broken.yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := InstallCRDs(t.Context(), env.Config, tt.path)
			if err == nil {
				t.Fatal("InstallCRDs succeeded")
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not mention %q:\n%v", want, err)
				}
			}
		})
	}
}

func TestReadCRDsSkipsOtherKinds(t *testing.T) {
	docs, err := readCRDs([]string{"testdata/crds"})
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 1 || docs[0].name != "widgets.testenv.capstan.dev" {
		t.Fatalf("readCRDs found %+v, want only widgets.testenv.capstan.dev", docs)
	}
	var obj map[string]any
	if err := json.Unmarshal(docs[0].json, &obj); err != nil {
		t.Fatal(err)
	}
	if _, ok := obj["status"]; ok {
		t.Errorf("status of the manifest is applied: %s", docs[0].json)
	}
}

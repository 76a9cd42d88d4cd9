package schema

import (
	"context"
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

func decode(t *testing.T, text string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(text), &obj.Object); err != nil {
		t.Fatal(err)
	}
	return obj
}

// Each rule of a CRD's schema that the API server enforces is found, with
// its field, and a valid object passes; built-in kinds are checked
// against the embedded OpenAPI documents of the pinned Kubernetes.
func TestValidate(t *testing.T) {
	data, err := os.ReadFile("testdata/gadgets-crd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	v := New(Kubernetes())
	if err := v.AddCRD(decode(t, string(data))); err != nil {
		t.Fatal(err)
	}
	const gadget = "apiVersion: schema.test.capstan.dev/v1\nkind: Gadget\nmetadata: {name: g, namespace: ns}\n"
	for _, tc := range []struct {
		name, object string
		field, msg   string // the one problem wanted; "" for none
	}{
		{"a valid object passes", gadget + "spec: {size: 3, mode: fast, host: a.example, min: 1, max: 2, extra: {anything: 1}}", "", ""},
		{"unknown field", gadget + "spec: {size: 3, sise: 3}", "spec.sise", "field not declared in schema"},
		{"wrong type", gadget + "spec: {size: three}", "spec.size", "must be of type integer"},
		{"missing required field", gadget + "spec: {mode: fast}", "spec.size", "Required value"},
		{"enum", gadget + "spec: {size: 3, mode: quick}", "spec.mode", `Unsupported value: "quick"`},
		{"pattern", gadget + "spec: {size: 3, host: A_B}", "spec.host", "should match"},
		{"maximum", gadget + "spec: {size: 11}", "spec.size", "less than or equal to 10"},
		{"CEL rule", gadget + "spec: {size: 3, min: 5, max: 2}", "spec", "min must not exceed max"},
		{"a list where a string goes", gadget + "spec: {size: 3, host: [a]}", "spec.host", ""},
		{"built-in kind, valid", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}", "", ""},
		{"built-in kind, unknown field", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replica: 2, selector: {}, template: {}}", "spec.replica", "field not declared in schema"},
		{"built-in kind, wrong type", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: [b]}", "data.a", "expected string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			problems, err := v.Validate(context.Background(), decode(t, tc.object))
			if err != nil {
				t.Fatal(err)
			}
			if tc.field == "" {
				if len(problems) != 0 {
					t.Errorf("problems = %+v, want none", problems)
				}
				return
			}
			if len(problems) != 1 || problems[0].Field != tc.field || !strings.Contains(problems[0].Message, tc.msg) {
				t.Errorf("problems = %+v, want one at %s saying %q", problems, tc.field, tc.msg)
			}
		})
	}
}

// A kind nothing describes is left to the served-API check.
func TestValidateUnknownKind(t *testing.T) {
	v := New(Kubernetes())
	for _, text := range []string{
		"apiVersion: nowhere.example/v1\nkind: Thing\nmetadata: {name: x}",
		"apiVersion: apps/v1\nkind: Thing\nmetadata: {name: x}",
	} {
		if _, err := v.Validate(context.Background(), decode(t, text)); err == nil || !strings.Contains(err.Error(), ErrUnknownKind.Error()) {
			t.Errorf("Validate(%q) error = %v, want ErrUnknownKind", text, err)
		}
	}
}

// A CRD added later replaces the schemas of its kind: a plan's CRD
// replaces the cluster's.
func TestAddCRDReplaces(t *testing.T) {
	data, err := os.ReadFile("testdata/gadgets-crd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	v := New(nil)
	if err := v.AddCRD(decode(t, string(data))); err != nil {
		t.Fatal(err)
	}
	newer := strings.Replace(string(data), "mode: {type: string, enum: [fast, safe]}", "mode: {type: string, enum: [fast, safe, quick]}", 1)
	if err := v.AddCRD(decode(t, newer)); err != nil {
		t.Fatal(err)
	}
	problems, err := v.Validate(context.Background(), decode(t, "apiVersion: schema.test.capstan.dev/v1\nkind: Gadget\nmetadata: {name: g}\nspec: {size: 3, mode: quick}"))
	if err != nil || len(problems) != 0 {
		t.Errorf("problems = %+v, %v; want none under the newer CRD", problems, err)
	}
}

// The embedded documents are the pinned Kubernetes version's.
func TestKubernetesVersion(t *testing.T) {
	if v := KubernetesVersion(); !strings.HasPrefix(v, "v1.") {
		t.Errorf("KubernetesVersion() = %q", v)
	}
}

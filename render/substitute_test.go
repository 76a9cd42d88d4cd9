package render

import (
	"context"
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"
	"testing/fstest"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func buildSubst(t *testing.T, vars map[string]string, strict bool) ([]*unstructured.Unstructured, error) {
	t.Helper()
	opts := DefaultOptions()
	opts.Path = "clusters/subst"
	opts.Substitute = vars
	opts.StrictSubstitute = strict
	return Build(context.Background(), repo, opts)
}

func field(t *testing.T, obj *unstructured.Unstructured, path ...string) interface{} {
	t.Helper()
	v, found, err := unstructured.NestedFieldNoCopy(obj.Object, path...)
	if err != nil || !found {
		t.Fatalf("%s: %v not found (%v)", objectNameOf(obj), path, err)
	}
	return v
}

func byKind(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	for _, obj := range objs {
		if obj.GetKind() == kind {
			return obj
		}
	}
	t.Fatalf("no %s among %d objects", kind, len(objs))
	return nil
}

func TestSubstitute(t *testing.T) {
	// A value that would break the YAML if it were pasted into it.
	tricky := "a: b # not a comment\n- [c, {d: \"e'"
	objs, err := buildSubst(t, map[string]string{
		"CLUSTER_NAME": "edge-1",
		"DESCRIPTION":  tricky,
		"WORKERS":      "3",
	}, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("got %d objects", len(objs))
	}
	cluster, script := objs[1], objs[0]
	if cluster.GetKind() != "Cluster" {
		cluster, script = script, cluster
	}
	for _, tc := range []struct {
		what string
		path []string
		want interface{}
	}{
		{"a plain variable", []string{"metadata", "name"}, "edge-1"},
		{"a default for an unset variable", []string{"metadata", "labels", "region"}, "eu-west-1"},
		{"a value with YAML syntax stays one string", []string{"spec", "description"}, tricky},
		{"a whole-value integer becomes an integer", []string{"spec", "workers"}, int64(3)},
		{"a whole-value boolean default becomes a boolean", []string{"spec", "paused"}, false},
		{"a float-looking value stays a string", []string{"spec", "version"}, "1.30"},
		{"a variable inside a string", []string{"spec", "topology", "class"}, "prefix-edge-1"},
	} {
		if got := field(t, cluster, tc.path...); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %v = %#v, want %#v", tc.what, tc.path, got, tc.want)
		}
	}
	if got := field(t, script, "data", "run.sh"); got != "echo \"${HOME}\"\n" {
		t.Errorf("object with %s: %s was substituted: %q", SubstituteAnnotation, SubstituteDisabled, got)
	}
	// The result must still be something the API machinery can copy.
	_ = cluster.DeepCopy()
}

func TestSubstituteUnsetVariableIsAnError(t *testing.T) {
	// Substitution on (a non-nil map) is always strict: a forgotten
	// variable must not become "" silently.
	_, err := buildSubst(t, map[string]string{"CLUSTER_NAME": "edge-1"}, false)
	var unset *UnsetVariableError
	if !errors.As(err, &unset) {
		t.Fatalf("err = %v, want an *UnsetVariableError", err)
	}
}

func TestBuildResultKeepsObjectsWithUnsetVariables(t *testing.T) {
	opts := DefaultOptions()
	opts.Path = "clusters/subst"
	opts.Substitute = map[string]string{"CLUSTER_NAME": "edge-1"}
	res, err := BuildResult(context.Background(), repo, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Objects) != 2 || len(res.Unset) != 2 {
		t.Fatalf("got %d objects and %d unset variables, want 2 and 2", len(res.Objects), len(res.Unset))
	}
	cluster := byKind(t, res.Objects, "Cluster")
	if got := field(t, cluster, "metadata", "name"); got != "edge-1" {
		t.Errorf("the rest of the object is not substituted: metadata.name = %v", got)
	}
	if got := field(t, cluster, "spec", "workers"); got != "${WORKERS}" {
		t.Errorf("spec.workers = %#v, want it left as written", got)
	}
	if !res.HasUnset(cluster) {
		t.Error("HasUnset(cluster) = false")
	}
	for i, obj := range res.Objects {
		if obj == cluster && res.Files[i] != "clusters/subst/cluster.yaml" {
			t.Errorf("Files[%d] = %q", i, res.Files[i])
		}
	}
}

func TestSubstituteStrictNamesFileObjectFieldAndVariable(t *testing.T) {
	_, err := buildSubst(t, map[string]string{"CLUSTER_NAME": "edge-1"}, true)
	got := renderErrors(err)
	want := []string{
		`clusters/subst/cluster.yaml: Cluster/default/edge-1: spec.description: ${DESCRIPTION} is not set and has no default: set DESCRIPTION in spec.substitute (or --substitute), or write ${DESCRIPTION:=default}, or ${DESCRIPTION:-} for an empty value`,
		`clusters/subst/cluster.yaml: Cluster/default/edge-1: spec.workers: ${WORKERS} is not set and has no default: set WORKERS in spec.substitute (or --substitute), or write ${WORKERS:=default}, or ${WORKERS:-} for an empty value`,
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %d errors", err, len(want))
	}
	for i := range want {
		if got[i].Error() != want[i] {
			t.Errorf("error %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
}

func TestSubstituteOff(t *testing.T) {
	objs, err := buildSubst(t, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := byKind(t, objs, "Cluster").GetName(); got != "${CLUSTER_NAME}" {
		t.Errorf("name = %q, want it untouched when substitution is off", got)
	}
}

func TestSubstituteInvalidVariableName(t *testing.T) {
	_, err := buildSubst(t, map[string]string{"BAD-NAME": "x", "1X": "y"}, false)
	if err == nil || !strings.Contains(err.Error(), `"1X" must match`) || !strings.Contains(err.Error(), `"BAD-NAME" must match`) {
		t.Fatalf("got %v, want both names reported", err)
	}
}

func TestSubstituteIdentityProblems(t *testing.T) {
	fsys := fstest.MapFS{
		"kustomization.yaml": {Data: []byte("resources: [cms.yaml]\n")},
		"cms.yaml": {Data: []byte(`apiVersion: v1
kind: ConfigMap
metadata:
  name: keys
data:
  ${KEY}: one
  fixed: two
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: ${B}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: same
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: ${C}
`)},
	}
	opts := DefaultOptions()
	opts.Substitute = map[string]string{"B": "same", "KEY": "fixed", "C": ""}
	_, err := Build(context.Background(), fsys, opts)
	var got []string
	for _, e := range renderErrors(err) {
		got = append(got, e.Error())
	}
	sort.Strings(got)
	want := []string{
		`cms.yaml: ConfigMap/${C}: metadata.name: empty after substitution`,
		`cms.yaml: ConfigMap/keys: data.fixed: key "fixed" is defined twice after substitution`,
		`cms.yaml: ConfigMap/same: after substitution the same object as ConfigMap/${B}`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if errors.Is(err, ErrLimit) {
		t.Error("substitution errors are not limit errors")
	}
}

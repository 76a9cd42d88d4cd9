package stages_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// TestDiffPlanSchemaChecksWhatNoDryRunReaches: objects in a Namespace the
// plan creates, or of a kind a CRD of the plan defines, cannot be dry-run
// before that object is applied. The diff (capstan diff, a pull request's
// plan) checks them against their schemas as the preflight does, and
// dry-runs those that fit and wait only for their namespace in the
// deployment's own namespace: one that does not fit, or that the API
// server's own validation refuses there, is invalid, naming field and
// file, and the preflight of the same plan names the same fields; those
// that pass stay creates the server cannot check yet.
func TestDiffPlanSchemaChecksWhatNoDryRunReaches(t *testing.T) {
	home := newNamespace(t) // skips under -short
	// The deployment lives in the test's namespace, which exists: the
	// stand-in of the dry runs of objects whose namespace the plan creates.
	owner := stages.Owner{Name: "cluster-a", Namespace: home}
	ctx := testContext(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	nsName := fmt.Sprintf("diff-schema-%d", time.Now().UnixNano())
	// A group of its own: a CRD outlives its test.
	group := nsName + ".test.capstan.dev"
	var crd *unstructured.Unstructured
	for _, obj := range loadObjects(t, "gadgets.yaml", "") {
		if obj.GetKind() == "CustomResourceDefinition" {
			crd = obj
			crd.SetName("gadgets." + group)
			if err := unstructured.SetNestedField(crd.Object, group, "spec", "group"); err != nil {
				t.Fatal(err)
			}
		}
	}
	gadget := object(group+"/v1alpha1", "Gadget", nsName, "g")
	gadget.Object["spec"] = map[string]any{"colour": "blue", "size": int64(3)}
	good := configMap(nsName, "good", map[string]any{"a": "b"})
	// Server-side apply finds an unknown field (or a wrong type) before
	// the API server looks for the namespace, and the dry run says so; a
	// value out of its schema's bounds it finds after, which only the
	// schema check sees.
	bad := configMap(nsName, "bad", nil)
	delete(bad.Object, "data")
	bad.Object["datas"] = map[string]any{"a": "b"}
	w := widget(nsName, "w", map[string]any{"size": int64(0)})
	// A key the ConfigMap's schema cannot judge, its validation can.
	badKey := configMap(nsName, "bad-key", map[string]any{"bad key!": "x"})
	plan, err := stages.BuildPlan([]capstanv1.StageSpec{
		{Name: "Definitions", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"Namespace", "CustomResourceDefinition"}}},
		{Name: "Objects", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"*"}}},
	}, []*unstructured.Unstructured{object("v1", "Namespace", "", nsName), crd, gadget, good, bad, w, badKey})
	if err != nil {
		t.Fatal(err)
	}
	plan.Files = map[*unstructured.Unstructured]string{gadget: "gadgets.yaml", good: "settings.yaml", bad: "settings.yaml", w: "widgets.yaml", badKey: "settings.yaml"}

	d, err := e.DiffPlan(ctx, plan, owner, stages.DiffOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		action stages.DiffAction
		field  string
		file   string
		says   string
	}{
		"Gadget/" + nsName + "/g":       {stages.DiffInvalid, "spec.size", "gadgets.yaml", "schema check: the schema of " + group + "/v1alpha1 Gadget declares no such field"},
		"Widget/" + nsName + "/w":       {stages.DiffInvalid, "spec.size", "widgets.yaml", "schema check: "},
		"ConfigMap/" + nsName + "/bad":  {stages.DiffInvalid, "datas", "settings.yaml", "field not declared in schema"},
		"ConfigMap/" + nsName + "/good": {stages.DiffCreate, "", "", ""},
		"ConfigMap/" + nsName + "/bad-key": {stages.DiffInvalid, "data[bad key!]", "settings.yaml",
			"the API server refuses the object (dry run in namespace " + home + ", its own being created by an earlier stage): "},
	}
	for ref, w := range want {
		o := objectDiff(t, d, ref)
		if o.Action != w.action || o.Field != w.field || o.File != w.file {
			t.Errorf("%s: %s at %q in %q (%s), want %s at %q in %q", ref, o.Action, o.Field, o.File, o.Error, w.action, w.field, w.file)
		}
		if !strings.Contains(o.Error, w.says) {
			t.Errorf("%s: error %q does not say %q", ref, o.Error, w.says)
		}
		if w.action == stages.DiffCreate && !strings.Contains(o.Note, "Namespace is created by this plan") {
			t.Errorf("%s: note %q, want it saying why the server cannot check it yet", ref, o.Note)
		}
	}
	if n := len(d.Problems()); n != 4 {
		t.Errorf("%d problems, want 4: %+v", n, d.Problems())
	}

	// The preflight of the same plan says the same, through the same check.
	report, err := e.Preflight(ctx, plan, owner, stages.PreflightOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, p := range report.Problems {
		fields[p.Object] = p.Field
	}
	if fields["Gadget "+nsName+"/g"] != "spec.size" || fields["ConfigMap "+nsName+"/bad"] != "datas" || fields["Widget "+nsName+"/w"] != "spec.size" ||
		fields["ConfigMap "+nsName+"/bad-key"] != "data[bad key!]" {
		t.Errorf("preflight problems %+v, want spec.size of the Gadget and the Widget, datas and data[bad key!] of the ConfigMaps", report.Problems)
	}
}

// TestStandInDryRunIgnoresAdmission: a refusal by admission (here a
// ValidatingAdmissionPolicy, whose default answer is Invalid like the API
// server's own) may depend on the namespace, so the dry run in the
// stand-in namespace does not count it: the object stays a create the
// server cannot check yet, in the diff and in the preflight alike.
func TestStandInDryRunIgnoresAdmission(t *testing.T) {
	home := newNamespace(t) // skips under -short
	owner := stages.Owner{Name: "cluster-a", Namespace: home}
	ctx := testContext(t)
	c, _ := newClient(t)
	nsName := fmt.Sprintf("stand-in-%d", time.Now().UnixNano())
	denied := nsName + "-denied"
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
		"metadata": map[string]any{"name": nsName},
		"spec": map[string]any{
			"failurePolicy": "Fail",
			"matchConstraints": map[string]any{"resourceRules": []any{map[string]any{
				"apiGroups": []any{""}, "apiVersions": []any{"v1"}, "operations": []any{"CREATE", "UPDATE"}, "resources": []any{"configmaps"},
			}}},
			"validations": []any{map[string]any{"expression": "object.metadata.name != '" + denied + "'", "message": "not in this namespace"}},
		},
	}}
	binding := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
		"metadata": map[string]any{"name": nsName},
		"spec":     map[string]any{"policyName": nsName, "validationActions": []any{"Deny"}},
	}}
	for _, obj := range []*unstructured.Unstructured{policy, binding} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), obj) })
	}
	// The policy takes effect once the API server has compiled it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.Create(ctx, configMap(home, denied, nil), client.DryRunAll)
		if apierrors.IsInvalid(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ValidatingAdmissionPolicy never refused ConfigMap %s (last: %v)", denied, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	e := stages.NewExecutor(c)
	cm := configMap(nsName, denied, map[string]any{"a": "b"})
	plan, err := stages.BuildPlan([]capstanv1.StageSpec{
		{Name: "Namespace", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"Namespace"}}},
		{Name: "Objects", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"*"}}},
	}, []*unstructured.Unstructured{object("v1", "Namespace", "", nsName), cm})
	if err != nil {
		t.Fatal(err)
	}
	d, err := e.DiffPlan(ctx, plan, owner, stages.DiffOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if o := objectDiff(t, d, "ConfigMap/"+nsName+"/"+denied); o.Action != stages.DiffCreate {
		t.Errorf("ConfigMap %s: %s (%s), want a create the server cannot check yet", denied, o.Action, o.Error)
	}
	report, err := e.Preflight(ctx, plan, owner, stages.PreflightOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Problems) != 0 {
		t.Errorf("preflight problems %+v, want none", report.Problems)
	}
}

// TestStandInDryRunSkipsKindsThePlanRedefines: a plan that changes a CRD
// the cluster has (here relaxing Widget's spec.size minimum from 1 to 0)
// before an object of that kind in a namespace it creates: the stand-in
// dry run would judge the object by the CRD the cluster has now, so it is
// not sent; the schema check, which reads the plan's CRD, passes it.
func TestStandInDryRunSkipsKindsThePlanRedefines(t *testing.T) {
	home := newNamespace(t) // skips under -short
	owner := stages.Owner{Name: "cluster-a", Namespace: home}
	ctx := testContext(t)
	c, _ := newClient(t)
	nsName := fmt.Sprintf("redefined-%d", time.Now().UnixNano())
	crd := loadObjects(t, "crds/widgets.yaml", "")[0]
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		if err := unstructured.SetNestedField(v.(map[string]any), int64(0), "schema", "openAPIV3Schema", "properties", "spec", "properties", "size", "minimum"); err != nil {
			t.Fatal(err)
		}
	}
	if err := unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	plan, err := stages.BuildPlan([]capstanv1.StageSpec{
		{Name: "Definitions", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"Namespace", "CustomResourceDefinition"}}},
		{Name: "Objects", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"*"}}},
	}, []*unstructured.Unstructured{object("v1", "Namespace", "", nsName), crd, widget(nsName, "zero", map[string]any{"size": int64(0)})})
	if err != nil {
		t.Fatal(err)
	}
	e := stages.NewExecutor(c)
	d, err := e.DiffPlan(ctx, plan, owner, stages.DiffOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if o := objectDiff(t, d, "Widget/"+nsName+"/zero"); o.Action != stages.DiffCreate {
		t.Errorf("Widget zero: %s (%s), want a create the server cannot check yet", o.Action, o.Error)
	}
	report, err := e.Preflight(ctx, plan, owner, stages.PreflightOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if errs := report.Errors(); len(errs) != 0 {
		t.Errorf("preflight errors %+v, want none", errs)
	}
}

package stages_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// TestDiffPlanSchemaChecksWhatNoDryRunReaches: objects in a Namespace the
// plan creates, or of a kind a CRD of the plan defines, cannot be dry-run
// before that object is applied. The diff (capstan diff, a pull request's
// plan) checks them against their schemas as the preflight does: one
// with an unknown field is invalid, naming field and file, and the
// preflight of the same plan names the same fields; those that fit stay
// creates the server cannot check yet.
func TestDiffPlanSchemaChecksWhatNoDryRunReaches(t *testing.T) {
	newNamespace(t) // skips under -short
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
	plan, err := stages.BuildPlan([]capstanv1.StageSpec{
		{Name: "Definitions", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"Namespace", "CustomResourceDefinition"}}},
		{Name: "Objects", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"*"}}},
	}, []*unstructured.Unstructured{object("v1", "Namespace", "", nsName), crd, gadget, good, bad, w})
	if err != nil {
		t.Fatal(err)
	}
	plan.Files = map[*unstructured.Unstructured]string{gadget: "gadgets.yaml", good: "settings.yaml", bad: "settings.yaml", w: "widgets.yaml"}

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
	if n := len(d.Problems()); n != 3 {
		t.Errorf("%d problems, want 3: %+v", n, d.Problems())
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
	if fields["Gadget "+nsName+"/g"] != "spec.size" || fields["ConfigMap "+nsName+"/bad"] != "datas" || fields["Widget "+nsName+"/w"] != "spec.size" {
		t.Errorf("preflight problems %+v, want spec.size of the Gadget, datas of the ConfigMap and the Widget's", report.Problems)
	}
}

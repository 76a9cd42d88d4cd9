package stages_test

import (
	"testing"

	"github.com/fluxcd/pkg/ssa"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// TestPreflightSkipsUnchangedObjects: the objects PreflightOptions.Unchanged
// names get no dry run at the preflight, and no request at the apply while
// the live object is the one Unchanged named; one written since goes the
// apply's normal way (dry run, then apply) and is restored.
func TestPreflightSkipsUnchangedObjects(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	e := stages.NewExecutor(c)
	const n = 10
	if _, err := e.Apply(ctx, configMaps(ns, n, "a"), "Config", owner); err != nil {
		t.Fatal(err)
	}
	objs := configMaps(ns, n, "a")
	objs[0] = configMap(ns, "cm-00", map[string]any{"v": "b"})
	known := map[*unstructured.Unstructured]*unstructured.Unstructured{}
	for _, obj := range objs[1:] {
		known[obj] = getLive(t, c, obj)
	}
	plan := &stages.Plan{Stages: []stages.Stage{configStage("Config", objs)}}
	dry := &stages.DryRuns{}
	mark := log.mark()
	report, err := e.Preflight(ctx, plan, owner, stages.PreflightOptions{Keep: dry,
		Unchanged: func(obj *unstructured.Unstructured) (types.UID, string, bool) {
			live, ok := known[obj]
			if !ok {
				return "", "", false
			}
			return live.GetUID(), live.GetResourceVersion(), true
		}})
	if err != nil || report.Err() != nil {
		t.Fatalf("Preflight = %v, %v", report.Problems, err)
	}
	if got := countRequests(log.since(mark)).dryRuns; got != 1 {
		t.Errorf("preflight sent %d dry runs, want 1: cm-00, the one changed", got)
	}
	if dry.Len() != n {
		t.Errorf("kept %d answers, want %d", dry.Len(), n)
	}

	// Written by someone else after the preflight: the skip is not trusted.
	edited := getLive(t, c, objs[5])
	edited.Object["data"] = map[string]any{"v": "edited"}
	if err := c.Update(ctx, edited); err != nil {
		t.Fatal(err)
	}
	mark = log.mark()
	res := e.Run(ctx, &plan.Stages[0], owner, stages.RunOptions{DryRuns: dry})
	if res.State != capstanv1.StageReady {
		t.Fatalf("Run = %s: %s", res.State, res.Message)
	}
	got := res.ChangeSet.ToGroupedMap()
	if len(got[ssa.UnchangedAction]) != n-2 || len(got[ssa.ConfiguredAction]) != 2 {
		t.Errorf("change set %v, want cm-00 and cm-05 configured, the rest unchanged", got)
	}
	if got, want := countRequests(log.since(mark)), (requestCounts{lists: 1, dryRuns: 1, applies: 2}); got != want {
		t.Errorf("requests %+v, want %+v: cm-05 dry-run again, cm-00 and cm-05 applied", got, want)
	}
	if v := getLive(t, c, objs[5]).Object["data"].(map[string]any)["v"]; v != "a" {
		t.Errorf("cm-05: v = %v, want a restored", v)
	}
}

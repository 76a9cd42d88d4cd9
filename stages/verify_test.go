package stages_test

import (
	"testing"

	"github.com/fluxcd/pkg/ssa"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/stages"
)

// TestVerifyFindsWhatChangedAndWritesNothing: Verify tells missing and
// changed objects from unchanged ones without a write, among many objects
// of other deployments in the namespace at the cost of one LIST (by the
// owner's labels), a dry run per object that exists and a GET for each one
// the LIST misses (its labels removed by hand, or deleted).
func TestVerifyFindsWhatChangedAndWritesNothing(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	e := stages.NewExecutor(c)
	applyOthers(t, e, ns, "a-other")
	mine := configMaps(ns, 10, "a")
	if _, err := e.Apply(ctx, mine, "Config", owner); err != nil {
		t.Fatal(err)
	}

	// (The others sort first: a LIST by name alone would meet them first.)
	// By hand: one deleted, one with a value changed, one without
	// Capstan's labels.
	edit := func(name string, change func(*corev1.ConfigMap)) {
		t.Helper()
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cm); err != nil {
			t.Fatal(err)
		}
		change(cm)
		if err := c.Update(ctx, cm, client.FieldOwner("kubectl-edit")); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Delete(ctx, mine[0].DeepCopy()); err != nil {
		t.Fatal(err)
	}
	edit(mine[1].GetName(), func(cm *corev1.ConfigMap) { cm.Data["v"] = "by hand" })
	edit(mine[2].GetName(), func(cm *corev1.ConfigMap) { cm.Labels = nil })

	mark := log.mark()
	entries, err := e.Verify(ctx, mine, "Config", owner)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]ssa.Action{mine[0].GetName(): ssa.CreatedAction, mine[1].GetName(): ssa.ConfiguredAction, mine[2].GetName(): ssa.ConfiguredAction}
	for i, entry := range entries {
		w, ok := want[mine[i].GetName()]
		if !ok {
			w = ssa.UnchangedAction
		}
		if entry.Action != w {
			t.Errorf("%s: %s, want %s", mine[i].GetName(), entry.Action, w)
		}
	}
	got := countRequests(log.since(mark))
	if got.lists != 1 || got.gets != 2 || got.dryRuns != len(mine)-1 || got.applies+got.deletes+got.other != 0 {
		t.Errorf("requests %+v, want one LIST, a GET for each of the two it misses, a dry run per existing object and no write", got)
	}
}

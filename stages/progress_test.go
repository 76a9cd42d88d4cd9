package stages_test

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// An attempt at a stage counts its objects ready, for
// status.stages[].progress: so far when its wait ends, all of them when
// it is Ready.
func TestRunCountsTheObjectsReady(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	stage := widgetStage(
		widget(ns, "a", map[string]any{"size": int64(1)}),
		widget(ns, "b", map[string]any{"size": int64(1)}),
		widget(ns, "c", map[string]any{"size": int64(1)}),
	)
	ready := func(name string) {
		t.Helper()
		obj := widget(ns, name, nil)
		patch := client.RawPatch(types.MergePatchType, []byte(`{"status":{"ready":true}}`))
		if err := c.Status().Patch(testContext(t), obj, patch); err != nil {
			t.Fatalf("mark Widget %s ready: %v", name, err)
		}
	}
	run := func(opts stages.RunOptions) stages.Result {
		ctx, cancel := context.WithTimeout(testContext(t), 3*time.Second)
		defer cancel()
		return e.Run(ctx, stage, owner, opts)
	}

	if res := run(stages.RunOptions{}); res.State != capstanv1.StageInProgress || res.Progress.String() != "0/3 objects ready" {
		t.Fatalf("first attempt: %s with progress %q, want InProgress at 0/3 objects ready", res.State, res.Progress)
	}
	ready("a")
	ready("b")
	if res := run(stages.RunOptions{SkipApply: true}); res.State != capstanv1.StageInProgress || res.Progress.String() != "2/3 objects ready" {
		t.Fatalf("two ready: %s with progress %q, want InProgress at 2/3 objects ready", res.State, res.Progress)
	}
	ready("c")
	if res := run(stages.RunOptions{SkipApply: true}); res.State != capstanv1.StageReady || res.Progress.String() != "3/3 objects ready" {
		t.Fatalf("all ready: %s with progress %q, want Ready at 3/3 objects ready", res.State, res.Progress)
	}
}

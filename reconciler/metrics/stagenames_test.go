package metrics_test

import (
	"fmt"
	"testing"
	"time"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
)

// A stage name is a committer's string: capstan_stage_duration_seconds,
// labelled by stage name only, keeps a name's histogram while some
// deployment known to the collector has a stage of that name, and drops
// it once none has, whether the stage left the plan or its deployment was
// deleted.
func TestStageDurationFollowsTheStageNamesInUse(t *testing.T) {
	c, reg := newCollector(t)
	ready := func(name string) capstanv1.StageStatus {
		return capstanv1.StageStatus{Name: name, State: capstanv1.StageReady, StartedAt: started(time.Minute)}
	}
	a := deployment("ns", "a", ready("Shared"), ready("OnlyA"))
	b := deployment("other", "b", ready("Shared"))
	feed(c, a, "main@sha1:1")
	feed(c, b, "main@sha1:1")
	histogram := metrics.StageDuration + "_count"
	has := func(stage string) bool {
		return len(find(gather(t, reg), histogram, map[string]string{"stage": stage})) > 0
	}
	for _, stage := range []string{"Shared", "OnlyA"} {
		if !has(stage) {
			t.Fatalf("no %s series for stage %s after it became Ready", histogram, stage)
		}
	}

	// OnlyA leaves a's plan: nobody runs a stage of that name any more.
	a.Status.Stages = a.Status.Stages[:1]
	feed(c, a, "main@sha1:2")
	if has("OnlyA") {
		t.Errorf("stage OnlyA left every plan, but %s{stage=\"OnlyA\"} is still exported", histogram)
	}
	// a is deleted; b still runs Shared.
	c.Forget("ns", "a")
	if !has("Shared") {
		t.Errorf("deployment b still has stage Shared, but its %s series went with deployment a", histogram)
	}
	c.Forget("other", "b")
	if has("Shared") {
		t.Errorf("every deployment with stage Shared was deleted, but %s{stage=\"Shared\"} is still exported", histogram)
	}
	for _, s := range gather(t, reg) {
		if s.labels["cluster"] != "" || s.labels["stage"] != "" {
			t.Errorf("after every deployment was deleted: %s", s)
		}
	}
}

// A committer who renames a stage at every revision makes a new stage
// name each time; the exported series stay those of the names in use.
func TestRenamedStagesDoNotAccumulateSeries(t *testing.T) {
	c, reg := newCollector(t)
	cd := deployment("ns", "churn")
	var first int
	for rev := range 200 {
		cd.Status.Stages = []capstanv1.StageStatus{
			{Name: "Fixed", State: capstanv1.StageReady, StartedAt: started(time.Minute)},
			{Name: fmt.Sprintf("Renamed%03d", rev), State: capstanv1.StageFailed, StartedAt: started(time.Minute)},
		}
		feed(c, cd, fmt.Sprintf("main@sha1:%040d", rev))
		if rev == 0 {
			first = len(gather(t, reg))
		}
	}
	if got := len(gather(t, reg)); got != first {
		t.Errorf("after 200 revisions that rename a stage: %d series, want the %d of the first (one plan of two stages)", got, first)
	}
}

// A stage that ends before its deployment's status names it (the
// reconciler observes the end, then writes the status) keeps its
// histogram; one whose status never came, because its deployment was
// deleted meanwhile, does not outlive it.
func TestStageDurationOfAStageNeverRecorded(t *testing.T) {
	c, reg := newCollector(t)
	c.ObserveStageEnd("Early", metrics.StageResultReady, time.Second)
	cd := deployment("ns", "d", capstanv1.StageStatus{Name: "Early", State: capstanv1.StageReady, StartedAt: started(time.Second)})
	c.RecordStages(cd)
	histogram := metrics.StageDuration + "_count"
	if n := len(find(gather(t, reg), histogram, map[string]string{"stage": "Early"})); n == 0 {
		t.Fatal("stage Early ended before its status was recorded, and lost its histogram")
	}
	c.ObserveStageEnd("Orphan", metrics.StageResultFailed, time.Second)
	c.Forget("ns", "d")
	for _, stage := range []string{"Early", "Orphan"} {
		if n := len(find(gather(t, reg), histogram, map[string]string{"stage": stage})); n != 0 {
			t.Errorf("stage %s: %d %s series after its deployment was deleted, want none", stage, n, histogram)
		}
	}
}

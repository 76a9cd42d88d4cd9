package report

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// flakyClusterPlanner plans every head as the shop fixture, with a stage
// on a cluster that does not answer for the first unanswered plans.
type flakyClusterPlanner struct {
	diff       *stages.PlanDiff
	mu         sync.Mutex
	calls      int
	unanswered int
}

func (p *flakyClusterPlanner) PlanHead(context.Context, *capstanv1.ClusterDeployment, string) (PlanResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.calls > p.unanswered {
		return PlanResult{Diff: p.diff}, nil
	}
	d := *p.diff
	d.Stages = append([]stages.StageDiff{{
		Name: "Addons", Action: capstanv1.StageActionApply, Cluster: "Secret shop/edge-kubeconfig",
		NotCompared: "cluster of Secret shop/edge-kubeconfig unreachable: connection refused", Works: true, Runs: true,
		Why:     "not compared: cluster of Secret shop/edge-kubeconfig unreachable: connection refused",
		Objects: []stages.ObjectDiff{{Ref: "ConfigMap/kube-system/cni", Kind: "ConfigMap", Name: "cni", Namespace: "kube-system", Action: stages.DiffNotCompared}},
	}}, d.Stages...)
	d.Unanswered = true
	return PlanResult{Diff: &d}, nil
}

func (p *flakyClusterPlanner) planned() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// A head planned while a cluster of one of its stages did not answer is
// commented with that stage not compared, and planned again at the next
// round until every stage is compared; then no more.
func TestPullRequestIsPlannedAgainWhileAClusterDoesNotAnswer(t *testing.T) {
	ctx := testContext(t)
	f := newRestartFixture(t, ctx)
	pr := f.openPullRequest(ctx, "addons")
	planner := &flakyClusterPlanner{diff: f.diff, unanswered: 2}
	w := f.watcher(&forgeTap{gets: map[string]int{}, writes: map[string]int{}}, prometheus.NewRegistry())
	w.planner = planner

	partial := f.until(ctx, w, pr.Number, "the plan with a stage not compared", func(b string) bool { return strings.Contains(b, "not compared") })
	if !strings.Contains(partial, "ConfigMap/kube-system/cni (not compared)") {
		t.Errorf("the plan does not list the object it could not compare:\n%s", partial)
	}
	whole := f.until(ctx, w, pr.Number, "the plan with every stage compared", func(b string) bool {
		return strings.HasPrefix(b, planHeading) && !strings.Contains(b, "not compared")
	})
	if got := planner.planned(); got != 3 {
		t.Errorf("the head was planned %d times, want 3: twice without an answer, once whole", got)
	}
	for range 5 {
		w.round(ctx)
	}
	if got := planner.planned(); got != 3 {
		t.Errorf("the head was planned %d times after its whole plan, want 3: a whole plan is not made again", got)
	}
	if got := f.comment(ctx, pr.Number); got != whole {
		t.Errorf("the comment changed after the whole plan:\n%s", got)
	}
}

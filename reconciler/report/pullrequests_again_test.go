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

func (p *flakyClusterPlanner) PlanHead(context.Context, *capstanv1.ClusterDeployment, string, bool) (PlanResult, error) {
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

// mergingPlanner merges the pull request while it plans its head, as a
// merge may land while another process plans: the branch then holds the
// head, and a dry run against clusters that run it changes nothing.
type mergingPlanner struct {
	f      *restartFixture
	pr     int64
	mu     sync.Mutex
	merged bool
}

func (p *mergingPlanner) PlanHead(ctx context.Context, _ *capstanv1.ClusterDeployment, _ string, _ bool) (PlanResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.merged {
		if _, err := p.f.s.MergePullRequest(ctx, p.f.repo, p.pr); err != nil {
			return PlanResult{}, err
		}
		p.merged = true
	}
	return PlanResult{Diff: &stages.PlanDiff{}}, nil
}

// A process that takes a pull request over (a restart, another replica)
// and plans it while it is merged does not replace the plan it was merged
// with by one made against clusters that already run it: the rollout
// that follows keeps showing the plan that was reviewed.
func TestPlanMadeWhileThePullRequestMergesIsNotWritten(t *testing.T) {
	ctx := testContext(t)
	f := newRestartFixture(t, ctx)
	pr := f.openPullRequest(ctx, "merging")
	reviewed := f.until(ctx, f.watcher(&forgeTap{gets: map[string]int{}, writes: map[string]int{}}, prometheus.NewRegistry()),
		pr.Number, "the plan", func(b string) bool { return strings.HasPrefix(b, planHeading) })

	tap := &forgeTap{gets: map[string]int{}, writes: map[string]int{}}
	heir := f.watcher(tap, prometheus.NewRegistry())
	planner := &mergingPlanner{f: f, pr: pr.Number}
	heir.planner = planner
	heir.round(ctx)
	if !planner.merged {
		t.Fatal("the heir did not plan the pull request it took over; the test proves nothing")
	}
	if got := f.comment(ctx, pr.Number); got != reviewed {
		t.Errorf("a plan made while the pull request merged replaced the one it was merged with:\n%s\n--- want\n%s", got, reviewed)
	}
	if _, writes := tap.count(pr.Number); writes != 0 {
		t.Errorf("the heir wrote the comment %d times, want none", writes)
	}
}

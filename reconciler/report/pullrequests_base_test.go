package report

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
)

// countingPlanner is shopPlanner, counting its plans and remembering
// whether each might decrypt.
type countingPlanner struct {
	shopPlanner
	mu       sync.Mutex
	calls    int
	decrypts []bool
}

func (p *countingPlanner) PlanHead(ctx context.Context, cd *capstanv1.ClusterDeployment, ref string, decrypt bool) (PlanResult, error) {
	p.mu.Lock()
	p.calls++
	p.decrypts = append(p.decrypts, decrypt)
	p.mu.Unlock()
	return p.shopPlanner.PlanHead(ctx, cd, ref, decrypt)
}

// decrypted reports whether the latest plan might decrypt.
func (p *countingPlanner) decrypted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.decrypts) > 0 && p.decrypts[len(p.decrypts)-1]
}

func (p *countingPlanner) planned() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// An open pull request's plan is made again once a rollout of the branch
// settles (its diff was against clusters that are gone), not while the
// rollout moves, and not again until another one settles.
func TestOpenPullRequestsArePlannedAgainWhenARolloutSettles(t *testing.T) {
	ctx := testContext(t)
	f := newRestartFixture(t, ctx)
	f.rollOut(ctx, strings.Repeat("1", 40), true)
	pr := f.openPullRequest(ctx, "change")
	planner := &countingPlanner{shopPlanner: shopPlanner{f.diff}}
	reg := prometheus.NewRegistry()
	w := f.watcher(&forgeTap{gets: map[string]int{}, writes: map[string]int{}}, reg)
	w.planner = planner
	// The clock moves a listing interval (the spec's 1s) between rounds.
	clock := time.Now()
	w.opts.Now = func() time.Time { return clock }
	round := func() {
		clock = clock.Add(2 * time.Second)
		w.round(ctx)
	}

	first := f.until(ctx, w, pr.Number, "the plan against the first rollout", func(b string) bool {
		return strings.Contains(b, "Compared with the clusters as `main@sha1:"+strings.Repeat("1", 40)+"` left them (Ready).")
	})
	if got := planner.planned(); got != 1 {
		t.Fatalf("planned %d times, want once", got)
	}

	f.rollOut(ctx, strings.Repeat("2", 40), false)
	for range 3 {
		round()
	}
	if got := planner.planned(); got != 1 {
		t.Errorf("planned %d times while a rollout moved, want once: the clusters change under a dry run", got)
	}
	if got := f.comment(ctx, pr.Number); got != first {
		t.Errorf("the comment changed while the rollout moved:\n%s", got)
	}

	f.rollOut(ctx, strings.Repeat("2", 40), true)
	round()
	if got := planner.planned(); got != 2 {
		t.Errorf("planned %d times after the rollout settled, want twice", got)
	}
	if got := f.comment(ctx, pr.Number); !strings.Contains(got, "as `main@sha1:"+strings.Repeat("2", 40)+"` left them (Ready).") {
		t.Errorf("the comment does not say what the new plan was compared with:\n%s", got)
	}
	for range 3 {
		round()
	}
	if got := planner.planned(); got != 2 {
		t.Errorf("planned %d times with nothing rolled out since, want twice", got)
	}
	for reason, want := range map[string]float64{metrics.PlanReasonHead: 1, metrics.PlanReasonRollout: 1, metrics.PlanReasonUnanswered: 0} {
		if got := counted(t, reg, metrics.PullRequestPlans, reason); got != want {
			t.Errorf("%s{reason=%q} = %v, want %v", metrics.PullRequestPlans, reason, got, want)
		}
	}
}

// stale is the rule: a new head, a cluster that did not answer, members
// added or gone, a member that settled in another state, or settled
// after a plan made while it moved.
func TestPlannedHeadStale(t *testing.T) {
	a := types.NamespacedName{Namespace: "ns", Name: "a"}
	b := types.NamespacedName{Namespace: "ns", Name: "b"}
	ready1 := liveState{key: "main@sha1:1@1:success"}
	ready2 := liveState{key: "main@sha1:2@1:success"}
	moving2 := liveState{key: "main@sha1:2@1:pending", moving: true}
	lives := func(kv ...any) map[types.NamespacedName]liveState {
		out := map[types.NamespacedName]liveState{}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i].(types.NamespacedName)] = kv[i+1].(liveState)
		}
		return out
	}
	for _, c := range []struct {
		name  string
		was   plannedHead
		head  string
		now   map[types.NamespacedName]liveState
		stale string
	}{
		{"nothing changed", plannedHead{head: "h", live: lives(a, ready1)}, "h", lives(a, ready1), ""},
		{"a new head", plannedHead{head: "h", live: lives(a, ready1)}, "h2", lives(a, ready1), metrics.PlanReasonHead},
		{"a cluster did not answer", plannedHead{head: "h", live: lives(a, ready1), again: true}, "h", lives(a, ready1), metrics.PlanReasonUnanswered},
		{"a rollout moves", plannedHead{head: "h", live: lives(a, ready1)}, "h", lives(a, moving2), ""},
		{"a rollout settled", plannedHead{head: "h", live: lives(a, ready1)}, "h", lives(a, ready2), metrics.PlanReasonRollout},
		{"planned while moving, settled", plannedHead{head: "h", live: lives(a, moving2)}, "h", lives(a, ready2), metrics.PlanReasonRollout},
		{"planned while moving, still moving", plannedHead{head: "h", live: lives(a, moving2)}, "h", lives(a, moving2), ""},
		{"one of two settled", plannedHead{head: "h", live: lives(a, ready1, b, moving2)}, "h", lives(a, ready2, b, moving2), metrics.PlanReasonRollout},
		{"a member added", plannedHead{head: "h", live: lives(a, ready1)}, "h", lives(a, ready1, b, ready1), metrics.PlanReasonMembers},
		{"a member gone", plannedHead{head: "h", live: lives(a, ready1, b, ready1)}, "h", lives(a, ready1), metrics.PlanReasonMembers},
	} {
		if got := c.was.stale(c.head, c.now); got != c.stale {
			t.Errorf("%s: stale = %q, want %q", c.name, got, c.stale)
		}
	}
}

// liveOf: a spec not reconciled yet moves, whatever its conditions say.
func TestLiveOfASpecNotReconciledYetMoves(t *testing.T) {
	cd := rolloutAt([]capstanv1.StageStatus{{Name: "Config", State: capstanv1.StageReady}},
		metav1.Condition{Type: capstanv1.ConditionReady, Status: metav1.ConditionTrue})
	cd.Status.Revision, cd.Generation, cd.Status.ObservedGeneration = "main@sha1:1", 2, 2
	if s := liveOf(cd); s.moving {
		t.Errorf("Ready at its generation: moving, want settled (%s)", s.text)
	}
	cd.Generation = 3
	if s := liveOf(cd); !s.moving || !strings.Contains(s.text, "planned again once it settles") {
		t.Errorf("a new generation not reconciled yet: %+v, want moving", s)
	}
}

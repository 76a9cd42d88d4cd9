package report

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
)

// A plan is a dry run against the clusters as they were when it was
// made. Once a member of the group rolls something else out (another
// pull request merged, a push to the branch, a change of its spec), the
// plans of the open pull requests describe clusters that are gone: they
// are made again when that rollout settles. A member still rolling out
// does not make them again (its clusters change under the dry run); its
// settling does.

// liveState is what a member's clusters hold, as far as a plan cares.
type liveState struct {
	// key changes when the member's clusters may have changed: another
	// revision or spec applied, or its outcome changed.
	key string
	// moving is set while the member is rolling out.
	moving bool
	// text says it in a plan comment, after "Compared with the clusters":
	// the revision and the phase.
	text string
}

// liveOf returns what cd's clusters hold.
func liveOf(cd *capstanv1.ClusterDeployment) liveState {
	if cd.Status.Revision == "" {
		return liveState{key: "none", moving: true, text: "before the deployment applied anything: planned again once it has"}
	}
	state, _ := commitState(cd)
	phase := NewFile(cd).Phase
	s := liveState{
		key:    fmt.Sprintf("%s@%d:%s", cd.Status.Revision, cd.Generation, state),
		moving: state == forge.StatePending || cd.Status.ObservedGeneration != cd.Generation,
		text:   fmt.Sprintf("as %s left them (%s)", code(cd.Status.Revision), phase),
	}
	if s.moving {
		s.text = fmt.Sprintf("while %s rolls out (%s", code(cd.Status.Revision), phase)
		if cur := cd.Status.CurrentStage; cur != "" {
			s.text += ", stage " + code(cur)
		}
		s.text += "): planned again once it settles"
	}
	return s
}

// plannedHead is what an open pull request was planned against.
type plannedHead struct {
	head string
	// gate is the key of the gate it was planned (or not) with
	// (prGate.key).
	gate string
	// live holds each member's state when planned.
	live map[types.NamespacedName]liveState
	// again is set when a cluster did not answer: the head is planned
	// again at the next listing, whatever else changed.
	again bool
}

// livesOf returns the state of each member.
func livesOf(members []*capstanv1.ClusterDeployment) map[types.NamespacedName]liveState {
	out := make(map[types.NamespacedName]liveState, len(members))
	for _, cd := range members {
		out[types.NamespacedName{Namespace: cd.Namespace, Name: cd.Name}] = liveOf(cd)
	}
	return out
}

// stale says why pull request head must be planned (again), "" when it
// need not: a new head, a cluster that did not answer, a member added or
// gone, or a member whose clusters settled in another state than the plan
// saw. A member still rolling out is left to settle.
func (p plannedHead) stale(head string, now map[types.NamespacedName]liveState) string {
	switch {
	case p.head != head:
		return metrics.PlanReasonHead
	case p.again:
		return metrics.PlanReasonUnanswered
	case len(p.live) != len(now):
		return metrics.PlanReasonMembers
	}
	for k, s := range now {
		was, ok := p.live[k]
		if !ok {
			return metrics.PlanReasonMembers
		}
		if !s.moving && (was.moving || was.key != s.key) {
			return metrics.PlanReasonRollout
		}
	}
	return ""
}

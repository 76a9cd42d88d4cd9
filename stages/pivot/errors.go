package pivot

import "github.com/capstan-dev/capstan/failure"

// Reasons of the failures of a move, in conditions, events and
// docs/troubleshooting.md. The stages package re-exports them.
const (
	// ReasonPivotBlocked: a move cannot start or go on until someone
	// acts: no target, a move into another cluster under way, a preflight
	// that found missing CRDs or a deployment in the way, objects of
	// Capstan's own namespace in the graph.
	ReasonPivotBlocked = "PivotBlocked"
	// ReasonFenced: the fencing record of the deployment names another
	// Capstan, which owns it now (after a pivot); this one must not write.
	ReasonFenced = "Fenced"
)

// Failure implements failure.Classified: another Capstan owns the
// deployment, and only a person deleting its fencing record (or the
// deployment moving back) changes that.
func (e *FencedError) Failure() *failure.Error {
	return &failure.Error{Reason: ReasonFenced, Policy: failure.PolicyStalled, Err: e}
}

// Failure implements failure.Classified. A problem someone must fix
// (missing kinds in the target, a deployment in the way) stalls the move.
// A problem that clears by itself (the target comes back, a machine
// finishes provisioning, a deletion completes) has no say of its own: it
// returns nil, so the caller's default, a retry with backoff, stands and
// the reason stays the caller's.
func (p *PreflightProblem) Failure() *failure.Error {
	if p.Waiting() {
		return nil
	}
	return &failure.Error{Reason: ReasonPivotBlocked, Policy: failure.PolicyStalled, Err: p}
}

var (
	_ failure.Classified = (*FencedError)(nil)
	_ failure.Classified = (*PreflightProblem)(nil)
)

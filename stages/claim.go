package stages

import (
	"context"
	"fmt"
)

// WithClaim makes the executor ask claim before every write for a
// deployment, next to the fencing record: the apply, scale, delete and
// rollout stages, a pivot before its handover, a drift correction, a
// prune. A non-nil error refuses the write; the stage fails with it and is
// retried. Sharded replicas (reconciler/shard.go) pass the check of their
// per-deployment claim, so that of two replicas only the one holding the
// claim writes.
func WithClaim(claim func(ctx context.Context, owner Owner) error) ExecutorOption {
	return func(e *Executor) { e.claim = claim }
}

// checkClaim returns the claim's refusal of a write for owner, nil without
// a claim.
func (e *Executor) checkClaim(ctx context.Context, owner Owner) error {
	if e.claim == nil {
		return nil
	}
	if err := e.claim(ctx, owner); err != nil {
		return fmt.Errorf("write for ClusterDeployment %s/%s: %w", owner.Namespace, owner.Name, err)
	}
	return nil
}

package stages

import (
	"context"
	"fmt"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// rolloutStage advances an LCM rollout until it is done or ctx ends.
func (e *Executor) rolloutStage(ctx context.Context, stage *Stage, owner Owner) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	return failed(res, Stalled(fmt.Errorf("stage %s: action %q is not supported yet", stage.Name, stage.Action)))
}

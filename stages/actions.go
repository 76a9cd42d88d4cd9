package stages

import (
	"context"
	"fmt"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// scaleStage sets the replicas of the selected workloads.
func (e *Executor) scaleStage(ctx context.Context, stage *Stage, owner Owner) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	return failed(res, Stalled(fmt.Errorf("stage %s: action %q is not supported yet", stage.Name, stage.Action)))
}

// deleteStage deletes the selected objects.
func (e *Executor) deleteStage(ctx context.Context, stage *Stage, owner Owner) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	return failed(res, Stalled(fmt.Errorf("stage %s: action %q is not supported yet", stage.Name, stage.Action)))
}

// waitDeleted waits until the selected objects are gone.
func (e *Executor) waitDeleted(ctx context.Context, stage *Stage, owner Owner) Result {
	return Result{Stage: stage.Name, State: capstanv1.StageReady}
}

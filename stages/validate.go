package stages

import (
	"context"
	"fmt"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// validateStage runs the preflight checks over the stage's objects.
func (e *Executor) validateStage(ctx context.Context, stage *Stage, owner Owner) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	return failed(res, Stalled(fmt.Errorf("stage %s: action %q is not supported yet", stage.Name, stage.Action)))
}

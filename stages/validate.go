package stages

import (
	"context"
	"fmt"
	"strings"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// validateStage runs the preflight checks over the stage's objects, the
// ones its selector matches, without touching the cluster. Errors fail the
// stage as stalled, since only a new commit can fix them, with the whole
// report in the message so that one commit can fix every problem.
// Warnings alone pass: the stage is left InProgress with the warnings as
// its message, and WaitStage then finds it Ready.
func (e *Executor) validateStage(_ context.Context, stage *Stage, _ Owner) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	report := preflight.Validate(stage.Objects)
	if len(report.Problems) == 0 {
		return res
	}
	verdict := "passed with"
	if err := report.Err(); err != nil {
		verdict = "found"
		res = failed(res, Stalled(fmt.Errorf("stage %s: preflight found %s:\n%w", stage.Name, report.Summary(), err)))
	}
	res.Message = fmt.Sprintf("preflight %s %s:\n%s", verdict, report.Summary(), strings.TrimSuffix(report.Lines(), "\n"))
	return res
}

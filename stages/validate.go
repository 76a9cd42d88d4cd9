package stages

import (
	"context"
	"fmt"
	"strings"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// validateStage runs the preflight checks, and nothing is applied while
// one of them reports an error:
//
//   - the network checks (stages/preflight) over the objects the stage's
//     select matches, without touching the cluster;
//   - the served-API check over every object of the plan: the cluster
//     must serve each one's apiVersion and kind (CheckServed), or a CRD
//     earlier in the plan define it. Without it, a kind whose provider is
//     missing would only fail when its stage applies it, after earlier
//     stages changed the cluster.
//
// Errors fail the stage as stalled, with the whole report in the message
// so that one commit can fix every problem: a wrong apiVersion needs a new
// commit, and a missing CRD is Stalled wherever Capstan finds it (an apply
// that meets one is too); docs/validation.md says why. Warnings alone
// pass: the stage is left InProgress with the warnings as its message, and
// WaitStage then finds it Ready. A cluster that cannot be asked fails the
// attempt, to be retried.
func (e *Executor) validateStage(ctx context.Context, stage *Stage, _ Owner) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	report := preflight.Validate(stage.Objects)
	served, err := e.checkServed(ctx, servedScope(stage))
	if err != nil {
		return failed(res, fmt.Errorf("stage %s: look up the APIs the cluster serves: %w", stage.Name, err))
	}
	report.Problems = append(report.Problems, served...)
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

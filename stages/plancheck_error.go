package stages

import (
	"errors"
	"fmt"
	"strings"

	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// PreflightError is a preflight report that holds at least one error:
// nothing of the revision may be applied until a new revision or spec
// fixes every problem. It is stalled.
type PreflightError struct {
	Report preflight.Report
	// Limit, when set, bounds the causes Error quotes, errors first; a
	// last line counts the rest.
	Limit int
}

// Error is the report's summary and its problems, one line per cause
// (preflight.Group): twenty objects in a namespace nobody creates are one
// line, not twenty. status.preflight.problems keeps every object.
func (e *PreflightError) Error() string {
	groups := preflight.Report{Problems: append(e.Report.Errors(), e.Report.Warnings()...)}.Groups()
	more := 0
	if e.Limit > 0 && len(groups) > e.Limit {
		for _, g := range groups[e.Limit:] {
			more += len(g.Problems)
		}
		groups = groups[:e.Limit]
	}
	lines := make([]string, 0, len(groups)+1)
	for _, g := range groups {
		lines = append(lines, g.Line(0))
	}
	if more > 0 {
		lines = append(lines, fmt.Sprintf("... and %d more in status.preflight.problems", more))
	}
	if len(lines) == 1 {
		// One cause reads on one line: the line a terminal (capstan dev,
		// kubectl's column) shows first says what to fix.
		return fmt.Sprintf("preflight found %s; nothing was applied: %s", e.Report.Summary(), lines[0])
	}
	return fmt.Sprintf("preflight found %s; nothing was applied:\n%s", e.Report.Summary(), strings.Join(lines, "\n"))
}

// Failure gives e its reason and policy: stalled, reason PreflightFailed.
func (e *PreflightError) Failure() *failure.Error {
	return &failure.Error{Reason: PreflightReason, Policy: failure.PolicyStalled, Err: e}
}

// IsPreflightFailed reports whether err is, or wraps, a PreflightError.
func IsPreflightFailed(err error) bool {
	var p *PreflightError
	return errors.As(err, &p)
}

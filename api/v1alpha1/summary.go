package v1alpha1

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StageProgress counts what a stage has done of what it must do: "3/5
// machines upgraded", "100/120 workers ready", "12/12 objects ready".
type StageProgress struct {
	// Done is how many are done.
	Done int32 `json:"done"`
	// Total is how many there are to do.
	Total int32 `json:"total"`
	// Unit says what is counted and what done means, in the plural:
	// "objects ready", "workers ready", "machines prepared".
	Unit string `json:"unit"`
}

// String is the progress as people read it: "3/5 machines ready".
func (p *StageProgress) String() string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf("%d/%d %s", p.Done, p.Total, p.Unit)
}

// StatusSummary is a deployment's status in the short form of kubectl's
// columns, the same as `capstan get` prints.
type StatusSummary struct {
	// Revision is status.revision cut to eight digits of its hash:
	// main@sha1:1a2b3c4d.
	// +optional
	Revision string `json:"revision,omitempty"`
	// Stage is the stage the deployment is at and the stages Ready out of
	// all ("WorkersReady 4/6", "6/6" once every stage is Ready), or "-"
	// when no stage ran at this revision and spec (none yet, or a source,
	// render or preflight failure stopped it before the first).
	// +optional
	Stage string `json:"stage,omitempty"`
	// Message is the Ready condition's message on one line, cut to 256
	// characters: a table cannot show a preflight report's lines.
	// +optional
	Message string `json:"message,omitempty"`
}

// maxSummaryMessage bounds StatusSummary.Message, in runes.
const maxSummaryMessage = 256

// shortHashDigits is how many digits of a hash a short revision keeps, as
// Flux shows them.
const shortHashDigits = 8

// ShortRevision shortens a revision for people: "main@sha1:1a2b3c4d",
// "v1.2.3@sha256:1a2b3c4d", "sha1:1a2b3c4d" (a pinned commit). What
// follows the last "<algorithm>:" is cut to eight digits; a revision
// without one is returned as it is. Every table that prints a revision
// uses it, and status.summary.revision holds it for kubectl.
func ShortRevision(rev string) string {
	for _, algo := range []string{"sha1:", "sha256:"} {
		i := strings.LastIndex(rev, algo)
		if i < 0 || (i > 0 && rev[i-1] != '@') {
			continue
		}
		if start := i + len(algo); len(rev) > start+shortHashDigits {
			return rev[:start+shortHashDigits]
		}
	}
	return rev
}

// StagesCurrent reports whether s.Stages describe the walk of the current
// revision and spec. They do not when a failure before the first stage
// stopped it (the source, the render, the preflight checks): the stages
// listed then are an earlier walk's, and ticks or "7/7 ready" beside that
// failure would tell of a revision that was never applied.
func (s *ClusterDeploymentStatus) StagesCurrent() bool {
	for _, st := range s.Stages {
		if st.Revision != "" && st.Revision != s.Revision {
			return false
		}
	}
	for _, c := range s.Conditions {
		if c.Type == ConditionReady && c.Status == metav1.ConditionFalse && failedBeforeStages(c.Reason) {
			return false
		}
	}
	return true
}

// failedBeforeStages tells the Ready reasons of failures that stop a
// revision before its first stage. They are written by the reconciler;
// source failures all start with "Source".
func failedBeforeStages(reason string) bool {
	switch reason {
	case "RenderFailed", "RenderLimitExceeded", "PlanInvalid", "BootstrapKeyUnused", "PreflightFailed":
		return true
	}
	return strings.HasPrefix(reason, "Source")
}

// StagesReady counts the stages that are Ready.
func (s *ClusterDeploymentStatus) StagesReady() int {
	n := 0
	for _, st := range s.Stages {
		if st.State == StageReady {
			n++
		}
	}
	return n
}

// StageText is the stage column of `capstan get` and kubectl: the current
// stage and the stages Ready out of all, "-" when no stage ran (see
// StatusSummary.Stage).
func (s *ClusterDeploymentStatus) StageText() string {
	if len(s.Stages) == 0 || !s.StagesCurrent() {
		return "-"
	}
	n := fmt.Sprintf("%d/%d", s.StagesReady(), len(s.Stages))
	if s.CurrentStage == "" || s.StagesReady() == len(s.Stages) {
		return n
	}
	return s.CurrentStage + " " + n
}

// Summarize returns the summary of s for status.summary.
func (s *ClusterDeploymentStatus) Summarize() *StatusSummary {
	sum := &StatusSummary{Revision: ShortRevision(s.Revision), Stage: s.StageText()}
	for _, c := range s.Conditions {
		if c.Type == ConditionReady {
			sum.Message = OneLine(c.Message)
		}
	}
	if r := []rune(sum.Message); len(r) > maxSummaryMessage {
		sum.Message = string(r[:maxSummaryMessage-1]) + "…"
	}
	return sum
}

// OneLine folds a multi-line message (errors.Join, a preflight report)
// into one line: "; " between lines, a space after a line that
// introduces the next with ":", tabs and runs of spaces as one space.
func OneLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	var b strings.Builder
	for i, l := range lines {
		l = strings.Join(strings.Fields(l), " ")
		if l == "" {
			continue
		}
		if b.Len() > 0 {
			if strings.HasSuffix(strings.TrimSpace(lines[i-1]), ":") {
				b.WriteString(" ")
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(l)
	}
	return b.String()
}

package main

import (
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/duration"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// maxWidth is the widest line human output prints, terminal or not.
const maxWidth = 100

// minWidth is the narrowest layout; a narrower terminal wraps.
const minWidth = 60

// Phases of a deployment as `capstan status` shows them.
const (
	phaseReady       = "Ready"
	phaseProgressing = "Progressing"
	phaseRetrying    = "Retrying"
	phaseStalled     = "Stalled"
	phaseSuspended   = "Suspended"
	phaseNew         = "New"
)

// view says how human output is drawn: at which time, how wide, and
// whether in colour.
type view struct {
	now   time.Time
	width int
	color bool
}

// ANSI SGR colours; used only when the output is a terminal.
const (
	sgrReset  = "\x1b[0m"
	sgrBold   = "\x1b[1m"
	sgrDim    = "\x1b[2m"
	sgrRed    = "\x1b[31m"
	sgrGreen  = "\x1b[32m"
	sgrYellow = "\x1b[33m"
)

func (v view) paint(sgr, s string) string {
	if !v.color || sgr == "" || s == "" {
		return s
	}
	return sgr + s + sgrReset
}

// phase sums a deployment up in one word, from its conditions.
func phase(cd *capstanv1.ClusterDeployment) string {
	ready := meta.FindStatusCondition(cd.Status.Conditions, capstanv1.ConditionReady)
	switch {
	case cd.Spec.Suspend:
		return phaseSuspended
	case meta.IsStatusConditionTrue(cd.Status.Conditions, capstanv1.ConditionStalled):
		return phaseStalled
	case ready == nil:
		return phaseNew
	case ready.Status == "True" && ready.ObservedGeneration == cd.Generation:
		return phaseReady
	case ready.Reason == "ReconcileFailed" || ready.Reason == "StageFailed" || ready.Reason == "NotFound":
		return phaseRetrying
	default:
		return phaseProgressing
	}
}

func phaseColor(p string) string {
	switch p {
	case phaseReady:
		return sgrGreen
	case phaseStalled, phaseRetrying:
		return sgrRed
	case phaseProgressing:
		return sgrYellow
	default:
		return sgrDim
	}
}

func stateText(st capstanv1.StageStatus) string {
	if st.Stuck && st.State != capstanv1.StageReady {
		return string(st.State) + " (stuck)"
	}
	return string(st.State)
}

func stateColor(st capstanv1.StageStatus) string {
	switch {
	case st.Stuck && st.State != capstanv1.StageReady, st.State == capstanv1.StageFailed:
		return sgrRed
	case st.State == capstanv1.StageReady:
		return sgrGreen
	case st.State == capstanv1.StageInProgress:
		return sgrYellow
	default:
		return sgrDim
	}
}

// oneLine folds a multi-line message (errors.Join) into one line.
func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\t", " ")
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// fit shortens s to at most n runes, marking the cut with "…".
func fit(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

func pad(s string, n int) string {
	if k := utf8.RuneCountInString(s); k < n {
		return s + strings.Repeat(" ", n-k)
	}
	return s
}

func ready(cd *capstanv1.ClusterDeployment) int {
	n := 0
	for _, st := range cd.Status.Stages {
		if st.State == capstanv1.StageReady {
			n++
		}
	}
	return n
}

// progressBar draws done of total as [#####.....] in width runes.
func (v view) progressBar(done, total, width int) string {
	inner := width - 2
	filled := 0
	if total > 0 {
		filled = done * inner / total
	}
	return "[" + v.paint(sgrGreen, strings.Repeat("#", filled)) + v.paint(sgrDim, strings.Repeat(".", inner-filled)) + "]"
}

// sortDeployments orders deployments by namespace, then name.
func sortDeployments(items []capstanv1.ClusterDeployment) {
	sort.Slice(items, func(i, j int) bool {
		if items[i].Namespace != items[j].Namespace {
			return items[i].Namespace < items[j].Namespace
		}
		return items[i].Name < items[j].Name
	})
}

// renderStatus draws every deployment: a header, a progress bar of stages
// Ready, the reason it is not Ready, and a table of its stages. No line is
// wider than v.width.
func (v view) renderStatus(items []capstanv1.ClusterDeployment) string {
	var b strings.Builder
	for i := range items {
		if i > 0 {
			b.WriteString("\n")
		}
		v.renderDeployment(&b, &items[i])
	}
	return b.String()
}

func (v view) renderDeployment(b *strings.Builder, cd *capstanv1.ClusterDeployment) {
	p := phase(cd)
	name := cd.Namespace + "/" + cd.Name
	rev := formatRevision(cd.Status.Revision)
	if rev == "" {
		rev = "no revision yet"
	}
	head := fit(name, v.width-len(p)-2-utf8.RuneCountInString(rev)-2)
	gap := v.width - utf8.RuneCountInString(head) - len(p) - 2 - utf8.RuneCountInString(rev)
	if gap < 2 {
		rev = fit(rev, utf8.RuneCountInString(rev)+gap-2)
		gap = 2
	}
	fmt.Fprintf(b, "%s  %s%s%s\n", v.paint(sgrBold, head), v.paint(phaseColor(p), p), strings.Repeat(" ", gap), v.paint(sgrDim, rev))

	total, done := len(cd.Status.Stages), ready(cd)
	summary := fmt.Sprintf(" %d/%d stages ready", done, total)
	if cd.Status.CurrentStage != "" {
		summary += ", at " + cd.Status.CurrentStage
	}
	summary = fit(summary, v.width-minBar)
	bar := max(minBar, min(maxBar, v.width-utf8.RuneCountInString(summary)))
	fmt.Fprintf(b, "%s%s\n", v.progressBar(done, total, bar), summary)

	if msg := reasonLine(cd, p); msg != "" {
		fmt.Fprintf(b, "%s\n", v.paint(phaseColor(p), fit(msg, v.width)))
	}
	if total > 0 {
		v.renderStages(b, cd.Status.Stages)
	}
}

// minBar and maxBar bound the progress bar's width, brackets included.
const (
	minBar = 12
	maxBar = 42
)

// reasonLine says why a deployment is not Ready, from the condition that
// best explains it.
func reasonLine(cd *capstanv1.ClusterDeployment, p string) string {
	typ := capstanv1.ConditionReady
	if p == phaseStalled {
		typ = capstanv1.ConditionStalled
	}
	switch p {
	case phaseReady, phaseSuspended:
		return ""
	case phaseNew:
		return "not reconciled yet: no Capstan daemon has written its status"
	}
	c := meta.FindStatusCondition(cd.Status.Conditions, typ)
	if c == nil || c.Message == "" {
		return ""
	}
	return c.Reason + ": " + oneLine(c.Message)
}

// Table columns: the name is capped so that the message keeps room, and
// shrinks further on a narrow terminal.
const (
	maxStageName = 32
	minStageName = 12
	minMessage   = 10
	colGap       = "  "
)

func (v view) renderStages(b *strings.Builder, stages []capstanv1.StageStatus) {
	type row struct{ name, state, age, attempts, message, color string }
	rows := make([]row, len(stages))
	head := row{name: "NAME", state: "STATE", age: "AGE", attempts: "ATTEMPTS", message: "MESSAGE"}
	nameW, stateW, ageW := len(head.name), len(head.state), len(head.age)
	for i, st := range stages {
		r := row{name: st.Name, state: stateText(st), age: "-", attempts: fmt.Sprint(st.Attempts), color: stateColor(st)}
		if st.StartedAt != nil && st.State != capstanv1.StagePending {
			r.age = duration.HumanDuration(v.now.Sub(st.StartedAt.Time))
		}
		r.message = oneLine(st.Message)
		if st.State == capstanv1.StageReady && st.StartedAt != nil && st.FinishedAt != nil {
			r.message = "ready after " + duration.HumanDuration(st.FinishedAt.Sub(st.StartedAt.Time))
		}
		nameW = max(nameW, min(utf8.RuneCountInString(r.name), maxStageName))
		stateW = max(stateW, len(r.state))
		ageW = max(ageW, len(r.age))
		rows[i] = r
	}
	attemptsW := len(head.attempts)
	msgW := v.width - nameW - stateW - ageW - attemptsW - 4*len(colGap)
	if msgW < minMessage {
		shrink := min(minMessage-msgW, max(nameW-minStageName, 0))
		nameW -= shrink
		msgW += shrink
	}
	line := func(r row, header bool) {
		state := pad(r.state, stateW)
		if !header {
			state = v.paint(r.color, state)
		}
		s := pad(fit(r.name, nameW), nameW) + colGap + state + colGap + pad(r.age, ageW) + colGap +
			pad(r.attempts, attemptsW) + colGap + fit(r.message, msgW)
		s = strings.TrimRight(s, " ")
		if header {
			s = v.paint(sgrBold, s)
		}
		b.WriteString(s + "\n")
	}
	line(head, true)
	for _, r := range rows {
		line(r, false)
	}
}

// renderFrame is one screen of `capstan status`: every deployment, or a
// line that says there is none.
func (v view) renderFrame(items []capstanv1.ClusterDeployment, where string) string {
	if len(items) == 0 {
		return fit("No ClusterDeployments "+where+".", v.width) + "\n"
	}
	return v.renderStatus(items)
}

package main

import (
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// maxHeader is the widest a deployment's header line is drawn.
const maxHeader = 100

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

// view says how human output is drawn: at which time, how wide, whether
// in colour, whether wide (-o wide: more columns, full revisions, messages
// wrapped rather than cut) and whether tables get a header line.
type view struct {
	now       time.Time
	width     int
	color     bool
	wide      bool
	noHeaders bool
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
	case ready.Reason == "ReconcileFailed" || ready.Reason == "StageFailed" || ready.Reason == "NotFound" ||
		strings.HasPrefix(ready.Reason, "Source") || retrying(cd):
		return phaseRetrying
	default:
		return phaseProgressing
	}
}

// retrying reports a failed attempt that is retried with backoff: the
// reconciler gives the Stalled condition the reason Retrying
// (reconciler/outcome.go).
func retrying(cd *capstanv1.ClusterDeployment) bool {
	c := meta.FindStatusCondition(cd.Status.Conditions, capstanv1.ConditionStalled)
	return c != nil && c.Status == "False" && c.Reason == "Retrying"
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

// oneLine folds a multi-line message into one line, as
// status.summary.message does.
var oneLine = capstanv1.OneLine

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

// renderStatus draws every deployment, a blank line between them. No
// line is wider than v.width.
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

// renderDeployment draws a header (name, phase, revision), then either
// the stages (a progress bar of stages Ready, why the deployment is not
// Ready, a table of its stages) or, when a failure stopped the revision
// before its first stage, that failure alone: the stages in status are
// then an earlier walk's, and their ticks would say the wrong thing.
func (v view) renderDeployment(b *strings.Builder, cd *capstanv1.ClusterDeployment) {
	p := phase(cd)
	v.renderHeader(b, cd, p)
	if !cd.Status.StagesCurrent() {
		v.renderStopped(b, cd, p)
		return
	}
	if total := len(cd.Status.Stages); total > 0 {
		b.WriteString(v.stagesLine(cd) + "\n")
	}
	if msg := reasonLine(cd, p); msg != "" {
		v.writeText(b, "  ", msg, phaseColor(p))
	}
	if msg := sourceLine(cd, p); msg != "" {
		v.writeText(b, "", msg, sgrYellow)
	}
	if len(cd.Status.Stages) > 0 {
		v.renderStages(b, cd.Status.Stages)
	}
}

// renderHeader draws "namespace/name  Phase" with the revision at the
// right edge: short, or whole with -o wide.
func (v view) renderHeader(b *strings.Builder, cd *capstanv1.ClusterDeployment, p string) {
	name := cd.Namespace + "/" + cd.Name
	rev := formatRevision(cd.Status.Revision)
	if v.wide {
		rev = cd.Status.Revision
	}
	if rev == "" {
		rev = "no revision yet"
	}
	if v.wide && utf8.RuneCountInString(name+p+rev)+6 > v.width {
		// A whole revision on a line of its own rather than a cut name.
		fmt.Fprintf(b, "%s  %s\n", v.paint(sgrBold, fit(name, v.width-len(p)-2)), v.paint(phaseColor(p), p))
		b.WriteString(v.paint(sgrDim, fit("revision "+rev, v.width)) + "\n")
		return
	}
	// On a wide screen the revision stays near the name, not 200 columns
	// away from it.
	width := min(v.width, maxHeader)
	head := fit(name, width-len(p)-2-utf8.RuneCountInString(rev)-2)
	gap := width - utf8.RuneCountInString(head) - len(p) - 2 - utf8.RuneCountInString(rev)
	if gap < 2 {
		rev = fit(rev, utf8.RuneCountInString(rev)+gap-2)
		gap = 2
	}
	fmt.Fprintf(b, "%s  %s%s%s\n", v.paint(sgrBold, head), v.paint(phaseColor(p), p), strings.Repeat(" ", gap), v.paint(sgrDim, rev))
}

// stagesLine is the progress bar of stages Ready, the counts, the stage
// the deployment is at and how far that stage is: "[####......] 2/6
// stages ready, at WorkersReady: 100/120 workers ready".
func (v view) stagesLine(cd *capstanv1.ClusterDeployment) string {
	total, done := len(cd.Status.Stages), cd.Status.StagesReady()
	summary := fmt.Sprintf(" %d/%d stages ready", done, total)
	if at := cd.Status.CurrentStage; at != "" && done < total {
		summary += ", at " + at
		if st := stageNamed(cd, at); st != nil && st.Progress != nil && st.State != capstanv1.StageReady {
			summary += ": " + st.Progress.String()
		}
	}
	summary = fit(summary, v.width-minBar)
	bar := max(minBar, min(maxBar, v.width-utf8.RuneCountInString(summary)))
	return v.progressBar(done, total, bar) + summary
}

func stageNamed(cd *capstanv1.ClusterDeployment, name string) *capstanv1.StageStatus {
	for i := range cd.Status.Stages {
		if cd.Status.Stages[i].Name == name {
			return &cd.Status.Stages[i]
		}
	}
	return nil
}

// maxFailureLines bounds the lines of a failure (a preflight report has
// one per problem) that status prints without -o wide.
const maxFailureLines = 12

// renderStopped draws a failure that stopped the revision before its
// first stage (source, render, preflight), one line per line of its
// message, and says what the cluster holds meanwhile.
func (v view) renderStopped(b *strings.Builder, cd *capstanv1.ClusterDeployment, p string) {
	reason, msg := failure(cd, p)
	var lines []string
	if msg = strings.TrimSpace(msg); msg != "" {
		lines = strings.Split(msg, "\n")
		lines[0] = reason + ": " + lines[0]
	}
	if !v.wide && len(lines) > maxFailureLines {
		more := len(lines) - maxFailureLines + 1
		lines = append(lines[:maxFailureLines-1], fmt.Sprintf("… and %d more lines (capstan status -o wide, or -o yaml)", more))
	}
	for i, line := range lines {
		if i == 0 {
			v.writeText(b, "  ", oneLine(line), phaseColor(p))
		} else {
			v.writeText(b, "    ", "  "+oneLine(line), phaseColor(p))
		}
	}
	if msg := sourceLine(cd, p); msg != "" && !strings.HasPrefix(reason, "Source") {
		v.writeText(b, "", msg, sgrYellow)
	}
	v.writeText(b, "", stoppedLine(cd), sgrDim)
}

// stoppedLine says that no stage ran, and what the cluster holds: what an
// earlier revision's stages applied, when they were at one.
func stoppedLine(cd *capstanv1.ClusterDeployment) string {
	for _, st := range cd.Status.Stages {
		if st.Revision != "" && st.Revision != cd.Status.Revision && st.State != capstanv1.StagePending {
			return "no stage ran at this revision; the cluster holds what " + formatRevision(st.Revision) + " applied"
		}
	}
	return "no stage ran at this revision and spec"
}

// writeText writes text as one line cut to the width, or with -o wide
// as many lines as it takes, the continued ones indented.
func (v view) writeText(b *strings.Builder, indent, text, color string) {
	if !v.wide {
		b.WriteString(v.paint(color, fit(text, v.width)) + "\n")
		return
	}
	for _, line := range wrapIndented(text, v.width, indent) {
		b.WriteString(v.paint(color, line) + "\n")
	}
}

// wrapIndented wraps text to width, the lines after the first indented.
func wrapIndented(text string, width int, indent string) []string {
	first := wrap(text, width)[0]
	rest := strings.TrimLeft(strings.TrimPrefix(text, first), " ")
	if rest == "" || !strings.HasPrefix(text, first) {
		return wrap(text, width)
	}
	lines := []string{first}
	for _, l := range wrap(rest, width-len(indent)) {
		lines = append(lines, indent+l)
	}
	return lines
}

// minBar and maxBar bound the progress bar's width, brackets included.
const (
	minBar = 12
	maxBar = 42
)

// reasonLine says why a deployment is not Ready, in one line, from the
// condition that best explains it.
func reasonLine(cd *capstanv1.ClusterDeployment, p string) string {
	switch p {
	case phaseReady, phaseSuspended:
		return ""
	case phaseNew:
		return "not reconciled yet: no Capstan daemon has written its status"
	}
	reason, msg := failure(cd, p)
	if msg == "" {
		return ""
	}
	return reason + ": " + oneLine(msg)
}

// failure is the reason and message of the condition that explains phase
// p: Stalled when stalled, else Ready.
func failure(cd *capstanv1.ClusterDeployment, p string) (reason, message string) {
	typ := capstanv1.ConditionReady
	if p == phaseStalled {
		typ = capstanv1.ConditionStalled
	}
	c := meta.FindStatusCondition(cd.Status.Conditions, typ)
	if c == nil {
		return "", ""
	}
	return c.Reason, c.Message
}

// sourceLine says that the source could not be fetched, when Ready does
// not say it already: the stages shown are those of the last revision
// fetched.
func sourceLine(cd *capstanv1.ClusterDeployment, p string) string {
	c := meta.FindStatusCondition(cd.Status.Conditions, capstanv1.ConditionSourceReady)
	if c == nil || c.Status != metav1.ConditionFalse || p == phaseSuspended {
		return ""
	}
	if r, _ := failure(cd, p); r == c.Reason {
		return ""
	}
	return "source not ready: " + c.Reason + ": " + oneLine(c.Message)
}

// renderFrame is one screen of `capstan status`: every deployment, or a
// line that says there is none.
func (v view) renderFrame(items []capstanv1.ClusterDeployment, where string) string {
	if len(items) == 0 {
		return fit("No ClusterDeployments "+where+".", v.width) + "\n"
	}
	return v.renderStatus(items)
}

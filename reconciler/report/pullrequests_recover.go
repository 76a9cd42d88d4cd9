package report

import (
	"context"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/capstan-dev/capstan/reconciler/report/forge"
)

// The plan of a merged pull request is kept in memory by the process that
// planned it. Another process (after a restart, or the replica that took
// the repository over under sharding) takes it back from the comment: the
// forge is the memory.

// planPartMarker is the hidden line between a rollout and the plan the pull
// request was merged with. No line of a rollout can be it: its lines start
// with Capstan's own text ("#", "|", "Merged as"), and the messages in it
// are escaped, "<" included.
const planPartMarker = "<!-- capstan:merged-plan -->"

// planSeparator is what a rollout and its plan part are joined with: a
// rule people see, then the marker.
const planSeparator = "\n---\n\n" + planPartMarker + "\n"

// oldPlanSeparator joined them before planPartMarker: a rule alone, which
// a rollout may hold too (a stage message "---"); it is taken for the
// separator only before a plan or a note.
const oldPlanSeparator = "\n---\n\n"

// Notes in the place of a plan Capstan cannot show. Each starts with
// notePrefix, by which a note read back is told from a plan.
const (
	notePrefix = "_The plan of this pull request is not shown"
	// noteRestarted stands in before the comment is read back; it is
	// never written (and was, before plans were read back).
	noteRestarted = notePrefix + " again: Capstan restarted since it made it._\n"
	noteNoComment = notePrefix + ": Capstan found no comment of its own on the pull request to take it from " +
		"(Capstan may not have been running while the pull request was open)._\n"
	noteCut = notePrefix + " again: the forge's size limit cut it from this comment, and Capstan restarted since it made it. " +
		"`capstan diff` prints a plan._\n"
	noteUnreadable = notePrefix + " again: Capstan restarted since it made it, and this comment held no plan it could read back._\n"
)

// planOfComment reads back the plan part of a comment Capstan keeps under
// PlanMarkerKey (its body without the marker line): the plan, as it was
// written, or, when the comment holds none that can be written again, the
// note to show instead (the one the comment holds, when it holds one).
func planOfComment(body string) (plan, note string) {
	body = strings.ReplaceAll(body, "\r\n", "\n")
	if forge.WasCut(body) {
		// Whatever is left of the plan is its beginning: written again,
		// it would pass for all of it.
		return "", noteCut
	}
	part := body
	if strings.HasPrefix(body, rolloutHeading) {
		var ok bool
		if part, ok = planPartOf(body); !ok {
			return "", noteUnreadable
		}
	}
	switch {
	case strings.HasPrefix(part, planHeading):
		return part, ""
	case strings.HasPrefix(part, notePrefix), strings.HasPrefix(part, notPlannedPrefix), strings.HasPrefix(part, queuedPrefix):
		line, _, _ := strings.Cut(part, "\n")
		return "", line + "\n"
	}
	return "", noteUnreadable
}

// planPartOf returns what follows the rollout in a rollout comment: after
// the first planPartMarker line, or, in a comment written before it
// existed, after the first rule followed by a plan or a note.
func planPartOf(body string) (string, bool) {
	if _, part, ok := strings.Cut(body, "\n"+planPartMarker+"\n"); ok {
		return part, true
	}
	for _, next := range []string{planHeading, notePrefix} {
		if i := strings.Index(body, oldPlanSeparator+next); i >= 0 {
			return body[i+len(oldPlanSeparator):], true
		}
	}
	return "", false
}

// recoverPlan takes the plan of pull request n back from its comment when
// this process has a rollout to show for it but did not plan it. It reads
// once per pull request, whatever it finds; a read that fails is reported
// as the forge's other failures and tried again at the next interval, and
// the caller must not write the comment meanwhile (it would replace the
// plan with a note). The plan read back was scrubbed when it was written;
// it is scrubbed again all the same.
func (w *PullRequests) recoverPlan(ctx context.Context, g *group, st *groupState, f forge.Forge, n int64) error {
	ps := st.prs[n]
	if ps.plan != "" || ps.read || len(ps.sections) == 0 {
		return nil
	}
	c, found, err := f.ReadComment(ctx, g.repo, n, PlanMarkerKey)
	if err = w.outcome(ctx, g, st, opRead, g.members, err); err != nil {
		return fmt.Errorf("read back the plan of pull request %d from its comment: %w", n, err)
	}
	plan, note := "", noteNoComment
	if found {
		plan, note = planOfComment(c.Body)
	}
	s, err := w.scrubberOf(ctx, g.members, ps.secrets)
	if err != nil {
		return err
	}
	ps.plan, ps.missing, ps.read = s.clean(plan), s.clean(note), true
	if ps.url == "" {
		ps.url = c.URL
	}
	log.FromContext(ctx).V(1).Info("pull request plan read back from its comment", "pullRequest", n, "found", found, "plan", plan != "")
	return nil
}

package report

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
)

// followRollouts finds the pull request each member's revision came from
// and, at most once per Interval, edits that pull request's comment and
// sets the member's commit status on the revision. It returns when
// something held back by the window is due (zero: nothing).
func (w *PullRequests) followRollouts(ctx context.Context, g *group, st *groupState, f forge.Forge) time.Time {
	logger := log.FromContext(ctx)
	now := w.opts.Now()
	var due time.Time
	later := func(t time.Time) {
		if due.IsZero() || t.Before(due) {
			due = t
		}
	}
	touched := map[int64]bool{}
	// unread holds the pull requests whose plan could not be read back
	// from their comment this round: the comment waits for the next.
	unread := map[int64]bool{}
	keys := map[types.NamespacedName]bool{}
	for _, cd := range g.members {
		key := types.NamespacedName{Namespace: cd.Namespace, Name: cd.Name}
		keys[key] = true
		sha := revisionSHA(cd.Status.Revision)
		if sha == "" {
			continue
		}
		rs := st.rollouts[key]
		if rs == nil || rs.sha != sha {
			rs = &rolloutState{sha: sha}
			st.rollouts[key] = rs
		}
		if !rs.looked && !now.Before(rs.lookAt) {
			n, err := w.pullRequestOf(ctx, g, st, f, sha)
			switch err = w.outcome(ctx, g, st, opLookup, []*capstanv1.ClusterDeployment{cd}, err); {
			case err != nil:
				if err = unreported(err); err != nil {
					logger.Error(err, "find the pull request a revision came from; trying again later", "revision", cd.Status.Revision)
				}
				rs.lookAt = now.Add(w.opts.Interval)
			case n == 0 && rs.lookups < maxCommitLookups:
				// A forge may record the merge a moment after the
				// merge commit reaches the branch: ask again, a few
				// times, before taking it for a commit pushed directly.
				rs.lookups++
				rs.lookAt = now.Add(w.opts.Interval)
			default:
				rs.looked, rs.pr = true, n
			}
		}
		if !rs.looked {
			later(rs.lookAt)
			continue
		}
		if rs.pr == 0 {
			continue
		}
		ps := st.prs[rs.pr]
		if ps == nil {
			ps = &prState{pr: forge.PullRequest{Number: rs.pr}, seen: now}
			st.prs[rs.pr] = ps
		}
		if ps.sections == nil {
			ps.sections = map[types.NamespacedName]string{}
		}
		ps.sections[key] = rolloutSection(cd)
		touched[rs.pr] = true
		// Before the commit status, which links to the comment read back.
		if !unread[rs.pr] {
			if err := w.recoverPlan(ctx, g, st, f, rs.pr); err != nil {
				unread[rs.pr] = true
				if err = unreported(err); err != nil {
					logger.Error(err, "read back the plan of a merged pull request; trying again later", "pullRequest", rs.pr)
				}
				later(now.Add(w.opts.Interval))
			}
		}

		// The commit status of this deployment on the revision.
		state, desc := commitState(cd)
		if mark := string(state) + "\x00" + desc; mark != rs.status {
			if at := rs.statusAt.Add(w.opts.Interval); now.Before(at) {
				later(at)
			} else if err := w.setStatus(ctx, f, g, st, cd, ps, rs, state, desc); err != nil {
				if err = unreported(err); err != nil {
					logger.Error(err, "set commit status; trying again later", "namespace", cd.Namespace, "name", cd.Name)
				}
				later(now.Add(w.opts.Interval))
			} else {
				rs.status, rs.statusAt = mark, now
			}
		}
	}
	for key := range st.rollouts {
		if !keys[key] {
			delete(st.rollouts, key)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(touched)) {
		ps := st.prs[n]
		if unread[n] {
			continue
		}
		if at := ps.sentAt.Add(w.opts.Interval); now.Before(at) {
			if body, err := w.commentBody(ctx, g, st, n); err == nil && body != ps.sent {
				later(at)
			}
			continue
		}
		if err := w.upsert(ctx, g, st, f, n); err != nil {
			if err = unreported(err); err != nil {
				logger.Error(err, "edit the pull request comment with the rollout; trying again later", "pullRequest", n)
			}
			later(now.Add(w.opts.Interval))
		}
	}
	return due
}

// pullRequestOf returns the pull request into the group's branch that
// commit sha came from, 0 for none.
func (w *PullRequests) pullRequestOf(ctx context.Context, g *group, st *groupState, f forge.Forge, sha string) (int64, error) {
	if n, ok := st.commits[sha]; ok && n != 0 {
		return n, nil
	}
	prs, err := f.PullRequestsForCommit(ctx, g.repo, sha)
	if err != nil {
		return 0, err
	}
	var found *forge.PullRequest
	for i := range prs {
		pr := &prs[i]
		if !pr.CameFrom(sha) || (pr.BaseRef != "" && pr.BaseRef != g.branch) {
			continue
		}
		if found == nil || (pr.Merged && !found.Merged) {
			found = pr
		}
	}
	var n int64
	if found != nil {
		n = found.Number
		ps := st.prs[n]
		if ps == nil {
			ps = &prState{}
			st.prs[n] = ps
		}
		ps.pr, ps.seen = *found, w.opts.Now()
	}
	st.commits[sha] = n
	return n, nil
}

// setStatus sets the commit status of cd on its revision.
func (w *PullRequests) setStatus(ctx context.Context, f forge.Forge, g *group, st *groupState, cd *capstanv1.ClusterDeployment,
	ps *prState, rs *rolloutState, state forge.State, desc string) error {
	s, err := w.scrubberOf(ctx, []*capstanv1.ClusterDeployment{cd}, ps.secrets)
	if err != nil {
		return err
	}
	name := cd.Spec.Report.PullRequests.StatusContext
	if name == "" {
		name = "capstan/" + cd.Namespace + "/" + cd.Name
	}
	_, err = owned(w, g, func() (struct{}, error) {
		return struct{}{}, f.SetCommitStatus(ctx, g.repo, rs.sha, forge.Status{State: state, Context: name, Description: s.clean(desc), TargetURL: ps.url})
	})
	return w.outcome(ctx, g, st, opStatus, []*capstanv1.ClusterDeployment{cd}, err)
}

// commentBody is the body of pull request n's comment: the rollouts of
// the revisions it brought, then its plan. Values of the Secrets of the
// deployments (and those the plan saw) are scrubbed from the rollouts;
// the plan was scrubbed when rendered.
func (w *PullRequests) commentBody(ctx context.Context, g *group, st *groupState, n int64) (string, error) {
	ps := st.prs[n]
	if len(ps.sections) == 0 {
		return ps.plan, nil
	}
	raw := rolloutHeader(ps.pr) + strings.Join(slices.Collect(func(yield func(string) bool) {
		for _, k := range slices.SortedFunc(maps.Keys(ps.sections), func(a, b types.NamespacedName) int {
			return strings.Compare(a.String(), b.String())
		}) {
			if !yield(ps.sections[k]) {
				return
			}
		}
	}), "\n")
	if raw == ps.rawRollout {
		return ps.rollout + ps.planPart(), nil
	}
	s, err := w.scrubberOf(ctx, g.members, ps.secrets)
	if err != nil {
		return "", err
	}
	ps.rawRollout, ps.rollout = raw, s.clean(raw)
	return ps.rollout + ps.planPart(), nil
}

// planPart is what follows the rollout: the plan, or why it is missing,
// after the separator planOfComment finds again.
func (ps *prState) planPart() string {
	switch {
	case ps.plan != "":
		return planSeparator + ps.plan
	case ps.missing != "":
		return planSeparator + ps.missing
	}
	return planSeparator + noteRestarted
}

func rolloutHeader(pr forge.PullRequest) string {
	sha := pr.MergeCommitSHA
	if sha == "" {
		sha = pr.HeadSHA
	}
	return fmt.Sprintf(rolloutHeading+"%d\n\nMerged as %s. The stages below follow the rollout; the plan this pull request was merged with is further down.\n\n",
		pr.Number, code(shortSHA(sha)))
}

// rolloutSection is one deployment's part of the rollout: its phase and
// its stage table, as `capstan status` shows them. It holds no running
// clock, so that it changes only when the rollout does.
func rolloutSection(cd *capstanv1.ClusterDeployment) string {
	var b strings.Builder
	f := NewFile(cd)
	icon := map[string]string{
		PhaseReady: ":white_check_mark:", PhaseStalled: ":x:", PhaseFailed: ":warning:", PhaseDeleting: ":wastebasket:",
	}[f.Phase]
	if icon == "" {
		icon = ":hourglass_flowing_sand:"
	}
	state, _ := commitState(cd)
	if state == forge.StateFailure && f.Phase != PhaseStalled {
		icon = ":x:"
	}
	fmt.Fprintf(&b, "#### %s %s: %s at %s", icon, code(cd.Namespace+"/"+cd.Name), f.Phase, code(cd.Status.Revision))
	if first, last, ok := span(cd); ok && f.Phase == PhaseReady {
		fmt.Fprintf(&b, " in %s", last.Sub(first).Round(time.Second))
	}
	b.WriteString("\n\n")
	if f.Message != "" && f.Phase != PhaseReady {
		b.WriteString(escape(oneLine(f.Message)) + "\n\n")
	}
	if len(cd.Status.Stages) == 0 {
		return b.String()
	}
	b.WriteString("| Stage | State | Started | Took | Message |\n|---|---|---|---|---|\n")
	for _, s := range cd.Status.Stages {
		st := string(s.State)
		if s.State == capstanv1.StageInProgress && s.Progress != nil {
			st += ", " + s.Progress.String()
		}
		if s.Stuck {
			st += " (stuck)"
		}
		took := ""
		switch {
		case s.StartedAt != nil && s.FinishedAt != nil && s.State == capstanv1.StageReady:
			took = s.FinishedAt.Sub(s.StartedAt.Time).Round(time.Second).String()
		case s.StartedAt != nil && s.State != capstanv1.StagePending:
			took = "running"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", code(s.Name), st, clock(s.StartedAt), took, escape(oneLine(s.Message)))
	}
	return b.String()
}

// commitState is the commit status of a deployment's rollout: success
// when Ready, failure when stalled or a stage is stuck (with its
// message), pending otherwise.
func commitState(cd *capstanv1.ClusterDeployment) (forge.State, string) {
	conds := cd.Status.Conditions
	if c := meta.FindStatusCondition(conds, capstanv1.ConditionStalled); c != nil && c.Status == metav1.ConditionTrue {
		return forge.StateFailure, "Stalled: " + oneLine(c.Message)
	}
	if c := meta.FindStatusCondition(conds, capstanv1.ConditionReady); c != nil && c.Status == metav1.ConditionTrue {
		desc := "Ready"
		if first, last, ok := span(cd); ok {
			desc += fmt.Sprintf(": %d stages in %s", len(cd.Status.Stages), last.Sub(first).Round(time.Second))
		}
		return forge.StateSuccess, desc
	}
	for _, s := range cd.Status.Stages {
		if s.Stuck {
			return forge.StateFailure, fmt.Sprintf("stage %s stuck: %s", s.Name, oneLine(s.Message))
		}
	}
	if cur := cd.Status.CurrentStage; cur != "" {
		for _, s := range cd.Status.Stages {
			if s.Name == cur {
				desc := fmt.Sprintf("stage %s %s", s.Name, s.State)
				if s.State == capstanv1.StageInProgress && s.Progress != nil {
					desc += " (" + s.Progress.String() + ")"
				}
				if s.Message != "" {
					desc += ": " + oneLine(s.Message)
				}
				return forge.StatePending, desc
			}
		}
	}
	return forge.StatePending, "rolling out"
}

// span is the time from the first stage's start to the last one's end.
func span(cd *capstanv1.ClusterDeployment) (time.Time, time.Time, bool) {
	var first, last time.Time
	for _, s := range cd.Status.Stages {
		if s.StartedAt != nil && (first.IsZero() || s.StartedAt.Before(&metav1.Time{Time: first})) {
			first = s.StartedAt.Time
		}
		if s.FinishedAt != nil && s.FinishedAt.After(last) {
			last = s.FinishedAt.Time
		}
	}
	return first, last, !first.IsZero() && !last.IsZero() && !last.Before(first)
}

func clock(t *metav1.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.UTC().Format("15:04:05Z")
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func shortSHA(sha string) string { return sha[:min(12, len(sha))] }

// revisionSHA is the commit of a git revision such as main@sha1:4f2c...;
// "" for a revision that names none.
func revisionSHA(rev string) string {
	_, sha, ok := strings.Cut(rev, "@sha1:")
	if !ok {
		return ""
	}
	return sha
}

// scrubberOf reads the Secrets of deployments whose values must stay out
// of comments and commit statuses: those secretNames lists and the forge
// token's, with extra.
func (w *PullRequests) scrubberOf(ctx context.Context, cds []*capstanv1.ClusterDeployment, extra []map[string][]byte) (*scrubber, error) {
	s := &scrubber{}
	if root := w.opts.Root; root != nil {
		s.addValue(root.Auth.Password)
		s.addValue(string(root.Auth.SSHPrivateKey))
	}
	for _, data := range extra {
		s.add(data)
	}
	seen := map[types.NamespacedName]bool{}
	for _, cd := range cds {
		names := secretNames(cd)
		if pr := cd.Spec.Report.PullRequests; pr != nil {
			names = append(names, pr.SecretRef.Name)
		}
		for _, name := range names {
			key := types.NamespacedName{Namespace: cd.Namespace, Name: name}
			if seen[key] {
				continue
			}
			seen[key] = true
			sec := &corev1.Secret{}
			if err := w.client.Get(ctx, key, sec); err != nil {
				if client.IgnoreNotFound(err) == nil {
					continue
				}
				return nil, fmt.Errorf("read Secret %s, whose values are kept out of comments: %w", key, err)
			}
			s.add(sec.Data)
		}
	}
	s.done()
	return s, nil
}

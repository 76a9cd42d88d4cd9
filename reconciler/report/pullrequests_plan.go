package report

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
)

// planOpen lists the open pull requests against the group's branch and
// plans, for every member that plans it (pullrequests_gate.go), each head
// not planned yet or planned against clusters a rollout has changed since
// (pullrequests_base.go): at most maxPlansPerInterval per member, the
// longest waiting first; the others are told they are queued. A pull
// request no member plans is told why, once.
func (w *PullRequests) planOpen(ctx context.Context, g *group, st *groupState, f forge.Forge) error {
	prs, err := f.OpenPullRequests(ctx, g.repo, g.branch)
	if err = w.outcome(ctx, g, st, opList, g.members, err); err != nil {
		return err
	}
	now := w.opts.Now()
	open := map[int64]bool{}
	var due []dueHead
	var errs []error
	for _, pr := range prs {
		open[pr.Number] = true
		gate := gateOf(g.members, pr)
		if len(gate.plan) == 0 {
			if err := w.notPlanned(ctx, g, st, f, pr, gate); err != nil {
				errs = append(errs, fmt.Errorf("pull request %d: %w", pr.Number, err))
			}
			continue
		}
		lives := livesOf(gateMembers(gate.plan))
		why := metrics.PlanReasonHead
		if p, ok := st.planned[pr.Number]; ok {
			if why = p.stale(pr.HeadSHA, lives); why == "" && p.gate != gate.key {
				why = metrics.PlanReasonMembers
			}
			if why == "" {
				continue
			}
		}
		since, ok := st.waiting[pr.Number]
		if !ok {
			since = now
			st.waiting[pr.Number] = now
		}
		due = append(due, dueHead{pr: pr, gate: gate, lives: lives, why: why, since: since})
	}
	byWaiting(due)
	left := budget{}
	var queued []dueHead
	for _, d := range due {
		if !left.take(d.gate) {
			queued = append(queued, d)
			continue
		}
		w.metrics.Planned(d.why)
		again, err := w.plan(ctx, g, st, f, d.pr, d.gate)
		if err != nil {
			errs = append(errs, fmt.Errorf("pull request %d: %w", d.pr.Number, err))
			continue
		}
		delete(st.waiting, d.pr.Number)
		st.planned[d.pr.Number] = plannedHead{head: d.pr.HeadSHA, gate: d.gate.key, live: d.lives, again: again}
	}
	for i, d := range queued {
		if err := w.queue(ctx, g, st, f, d, i, g.interval); err != nil {
			errs = append(errs, fmt.Errorf("pull request %d: %w", d.pr.Number, err))
		}
	}
	for n := range st.planned {
		if !open[n] {
			delete(st.planned, n) // merged or closed: its plan stays for the rollout
		}
	}
	for n := range st.waiting {
		if !open[n] {
			delete(st.waiting, n)
		}
	}
	st.evict()
	return errors.Join(errs...)
}

// plan plans one pull request's head for every member the gate lets plan
// it and keeps the comment; the others are named as not planning it. It
// returns again when a cluster a stage acts on did not answer: the plan is
// commented with those stages not compared, and the head is planned again
// at the next interval.
func (w *PullRequests) plan(ctx context.Context, g *group, st *groupState, f forge.Forge, pr forge.PullRequest, gate prGate) (again bool, err error) {
	in := PlanCommentInput{PRNumber: pr.Number}
	for _, m := range gate.plan {
		cd := m.cd
		res, err := w.planner.PlanHead(ctx, cd, pr.HeadFetchRef)
		if err != nil {
			return false, fmt.Errorf("plan %s for ClusterDeployment %s/%s: %w", pr.HeadFetchRef, cd.Namespace, cd.Name, err)
		}
		again = again || res.Diff != nil && res.Diff.Unanswered
		if in.Revision == "" {
			in.Revision = res.Revision
		}
		in.Secrets = append(in.Secrets, res.Secrets...)
		if res.Err == nil && res.Diff != nil && !res.Diff.Changes() {
			continue // the pull request does not touch this deployment
		}
		diff := res.Diff
		if m.hide && diff != nil {
			diff = diff.WithoutValues()
		}
		in.Deployments = append(in.Deployments, PlanCommentDeployment{Name: cd.Name, Namespace: cd.Namespace,
			Diff: diff, Err: res.Err, Live: liveOf(cd).text, ValuesHidden: m.hide})
	}
	for _, m := range gate.skip {
		in.NotPlanned = append(in.NotPlanned, PlanCommentNotPlanned{Name: m.cd.Name, Namespace: m.cd.Namespace, Why: notPlannedWhy})
	}
	if in.Revision == "" {
		in.Revision = pr.HeadFetchRef + "@sha1:" + pr.HeadSHA
	}
	ps := st.prs[pr.Number]
	if ps == nil {
		ps = &prState{}
		st.prs[pr.Number] = ps
	}
	ps.pr, ps.seen, ps.queued = pr, w.opts.Now(), false
	ps.plan = strings.TrimPrefix(RenderPlanComment(in), PlanMarker+"\n")
	ps.secrets = in.Secrets
	return again, w.upsert(ctx, g, st, f, pr.Number)
}

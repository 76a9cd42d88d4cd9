package report

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/log"

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
	var made []madePlan
	for _, d := range due {
		if !left.take(d.gate) {
			queued = append(queued, d)
			continue
		}
		w.metrics.Planned(d.why)
		m, err := w.makePlan(ctx, d)
		if err != nil {
			errs = append(errs, fmt.Errorf("pull request %d: %w", d.pr.Number, err))
			continue
		}
		made = append(made, m)
	}
	if still, err := w.stillOpen(ctx, g, st, f, made); err != nil {
		errs = append(errs, err)
	} else {
		for _, m := range made {
			n := m.d.pr.Number
			if !still[n] {
				log.FromContext(ctx).V(1).Info("pull request merged, closed or pushed to while it was planned; its plan is not written", "pullRequest", n)
				continue
			}
			if err := w.writePlan(ctx, g, st, f, m); err != nil {
				errs = append(errs, fmt.Errorf("pull request %d: %w", n, err))
				continue
			}
			delete(st.waiting, n)
			st.planned[n] = plannedHead{head: m.d.pr.HeadSHA, gate: m.d.gate.key, live: m.d.lives, again: m.again}
		}
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

// madePlan is the plan of one pull request's head, made but not written.
type madePlan struct {
	d       dueHead
	plan    string
	secrets []map[string][]byte
	again   bool
}

// stillOpen lists the open pull requests again once plans were made, and
// returns those of made whose head is still the one planned. A plan takes
// a while, and the forge may record a merge only after its commit reached
// the branch: meanwhile the branch rolls out, and a dry run of the head
// against clusters that already run it says it changes nothing. Written,
// that plan would replace the one the pull request was merged with, which
// its rollout keeps showing. One more listing per round that planned.
func (w *PullRequests) stillOpen(ctx context.Context, g *group, st *groupState, f forge.Forge, made []madePlan) (map[int64]bool, error) {
	if len(made) == 0 {
		return nil, nil
	}
	prs, err := f.OpenPullRequests(ctx, g.repo, g.branch)
	if err = w.outcome(ctx, g, st, opList, g.members, err); err != nil {
		return nil, err
	}
	heads := make(map[int64]string, len(prs))
	for _, pr := range prs {
		heads[pr.Number] = pr.HeadSHA
	}
	out := make(map[int64]bool, len(made))
	for _, m := range made {
		out[m.d.pr.Number] = heads[m.d.pr.Number] == m.d.pr.HeadSHA
	}
	return out, nil
}

// makePlan plans one pull request's head for every member the gate lets
// plan it; the others are named as not planning it. again is set when a
// cluster a stage acts on did not answer: the plan is commented with
// those stages not compared, and the head is planned again at the next
// interval. Nothing is written.
func (w *PullRequests) makePlan(ctx context.Context, d dueHead) (madePlan, error) {
	pr, gate := d.pr, d.gate
	m := madePlan{d: d}
	in := PlanCommentInput{PRNumber: pr.Number}
	for _, mg := range gate.plan {
		cd := mg.cd
		res, err := w.planner.PlanHead(ctx, cd, pr.HeadFetchRef, mg.decrypt)
		if err != nil {
			return m, fmt.Errorf("plan %s for ClusterDeployment %s/%s: %w", pr.HeadFetchRef, cd.Namespace, cd.Name, err)
		}
		m.again = m.again || res.Diff != nil && res.Diff.Unanswered
		if in.Revision == "" {
			in.Revision = res.Revision
		}
		in.Secrets = append(in.Secrets, res.Secrets...)
		if res.Err == nil && res.Diff != nil && !res.Diff.Changes() {
			continue // the pull request does not touch this deployment
		}
		diff := res.Diff
		if mg.hide && diff != nil {
			diff = diff.WithoutValues()
		}
		in.Deployments = append(in.Deployments, PlanCommentDeployment{Name: cd.Name, Namespace: cd.Namespace,
			Diff: diff, Err: res.Err, Live: liveOf(cd).text, ValuesHidden: mg.hide})
	}
	for _, mg := range gate.skip {
		in.NotPlanned = append(in.NotPlanned, PlanCommentNotPlanned{Name: mg.cd.Name, Namespace: mg.cd.Namespace, Why: notPlannedWhy})
	}
	if in.Revision == "" {
		in.Revision = pr.HeadFetchRef + "@sha1:" + pr.HeadSHA
	}
	m.plan = strings.TrimPrefix(RenderPlanComment(in), PlanMarker+"\n")
	m.secrets = in.Secrets
	return m, nil
}

// writePlan gives a pull request's comment the plan made of its head.
func (w *PullRequests) writePlan(ctx context.Context, g *group, st *groupState, f forge.Forge, m madePlan) error {
	n := m.d.pr.Number
	ps := st.prs[n]
	if ps == nil {
		ps = &prState{}
		st.prs[n] = ps
	}
	ps.pr, ps.seen, ps.queued = m.d.pr, w.opts.Now(), false
	ps.plan, ps.secrets = m.plan, m.secrets
	return w.upsert(ctx, g, st, f, n)
}

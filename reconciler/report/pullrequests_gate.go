package report

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
)

// A pull request is a stranger's input: planning it fetches its head,
// renders it and dry-runs it against the live clusters with the
// deployment's identity, and its comment is public. So only pull requests
// from branches of the repository itself (whose authors can push what
// Capstan applies anyway) are planned by default. One from a fork is
// planned when the forge names its author the repository's owner, a
// member or a collaborator, or when the deployment says forks: plan; else
// it gets a one-line comment saying why, and costs nothing else: no fetch,
// no render, no request to any cluster. Plans of forks hide values unless
// the deployment says values: show; values: hide hides them everywhere.

// memberGate is what one member does with one pull request.
type memberGate struct {
	cd   *capstanv1.ClusterDeployment
	plan bool
	// hide leaves the values out of the member's part of the plan.
	hide bool
	// decrypt lets the member's plan decrypt sops files: a pull request
	// from this repository's branches, or from a fork of an author the
	// forge names trusted (who could push here anyway). A stranger's fork
	// planned because of forks: plan is planned without the keys.
	decrypt bool
}

// prGate is what the members of a group do with one pull request.
type prGate struct {
	// plan are the members that plan it, skip those that do not.
	plan, skip []memberGate
	// key changes when who plans it, or who sees values, changes: the
	// pull request is planned (or told it is not) again.
	key string
}

// gateOf decides, for every member, whether pull request pr is planned
// and whether values are shown.
func gateOf(members []*capstanv1.ClusterDeployment, pr forge.PullRequest) prGate {
	var g prGate
	var key strings.Builder
	for _, cd := range members {
		m := gateMember(cd, pr)
		switch {
		case !m.plan:
			g.skip = append(g.skip, m)
			fmt.Fprintf(&key, "skip %s/%s;", cd.Namespace, cd.Name)
		default:
			g.plan = append(g.plan, m)
			fmt.Fprintf(&key, "plan %s/%s hide=%v;", cd.Namespace, cd.Name, m.hide)
		}
	}
	g.key = key.String()
	return g
}

func gateMember(cd *capstanv1.ClusterDeployment, pr forge.PullRequest) memberGate {
	spec := cd.Spec.Report.PullRequests
	m := memberGate{cd: cd, plan: true, hide: spec.Values == capstanv1.ValuesHide, decrypt: true}
	if !pr.Fork {
		return m
	}
	m.decrypt = pr.TrustedAuthor()
	// Values are hidden from the plans of forks unless shown on purpose,
	// the authors' association notwithstanding: a member of an
	// organization may not be allowed to read the clusters.
	m.hide = spec.Values != capstanv1.ValuesShow
	m.plan = spec.Forks == capstanv1.ForksPlan || pr.TrustedAuthor()
	return m
}

// gateMembers returns the deployments of ms.
func gateMembers(ms []memberGate) []*capstanv1.ClusterDeployment {
	out := make([]*capstanv1.ClusterDeployment, len(ms))
	for i, m := range ms {
		out[i] = m.cd
	}
	return out
}

// names lists the members of a gate as `ns/name`, `ns/name`.
func names(ms []memberGate) string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = code(m.cd.Namespace + "/" + m.cd.Name)
	}
	return strings.Join(out, ", ")
}

// Notes that stand in the place of a plan Capstan did not make. They are
// one line each, and read back (planOfComment) as notes.
const (
	notPlannedPrefix = "_Capstan did not plan this pull request"
	queuedPrefix     = "_Capstan has not planned this pull request yet"
)

// notPlannedNote says why no member plans a pull request from a fork.
func notPlannedNote(g prGate) string {
	return notPlannedPrefix + ": it comes from a fork (its branch is not one of this repository's), and " + names(g.skip) +
		" plans pull requests from forks only when the forge names their author the repository's owner, a member or a collaborator, " +
		"or with `spec.report.pullRequests.forks: plan`. A maintainer can push its branch to this repository to have it planned._\n"
}

// notPlannedWhy is the line of a member that does not plan a pull request
// that others do.
const notPlannedWhy = "Not planned: the pull request comes from a fork, and this deployment plans forks only of trusted authors " +
	"(the repository's owner, members, collaborators) or with `spec.report.pullRequests.forks: plan`."

// maxPlans is how many pull requests cd plans per interval.
func maxPlans(cd *capstanv1.ClusterDeployment) int {
	n := int(cd.Spec.Report.PullRequests.MaxPlansPerInterval)
	if n <= 0 {
		return capstanv1.DefaultMaxPlansPerInterval
	}
	return min(n, 100)
}

// queuedNote says that a pull request waits for a later interval, with
// ahead others before it, behind a bound of perInterval plans.
func queuedNote(perInterval, ahead int, interval time.Duration) string {
	intervals := ahead/perInterval + 1
	plural := func(n int, one, many string) string {
		if n == 1 {
			return fmt.Sprintf("%d %s", n, one)
		}
		return fmt.Sprintf("%d %s", n, many)
	}
	return fmt.Sprintf("%s: it is queued. At most %s planned per interval (`spec.report.pullRequests.maxPlansPerInterval`), "+
		"and %s ahead of this one, so it is planned within %s of %s. This comment will hold its plan then._\n",
		queuedPrefix, plural(perInterval, "pull request is", "pull requests are"), plural(ahead, "is", "are"),
		plural(intervals, "interval", "intervals"), interval)
}

// budget counts the plans each member has left in this interval.
type budget map[types.NamespacedName]int

// take uses one plan of every member of g, if each has one left.
func (b budget) take(g prGate) bool {
	for _, m := range g.plan {
		key := types.NamespacedName{Namespace: m.cd.Namespace, Name: m.cd.Name}
		if _, ok := b[key]; !ok {
			b[key] = maxPlans(m.cd)
		}
		if b[key] == 0 {
			return false
		}
	}
	for _, m := range g.plan {
		b[types.NamespacedName{Namespace: m.cd.Namespace, Name: m.cd.Name}]--
	}
	return true
}

// perInterval is the fewest plans per interval of the members of g: the
// pace of its queue.
func perInterval(g prGate) int {
	n := 100
	for _, m := range g.plan {
		n = min(n, maxPlans(m.cd))
	}
	return n
}

// dueHead is an open pull request whose head is to be planned.
type dueHead struct {
	pr    forge.PullRequest
	gate  prGate
	lives map[types.NamespacedName]liveState
	why   string
	since time.Time
}

// byWaiting orders the heads to plan: the longest waiting first, so that
// none starves behind newer ones; a new head, or a plan gone stale, joins
// at the back.
func byWaiting(due []dueHead) {
	slices.SortStableFunc(due, func(a, b dueHead) int {
		if c := a.since.Compare(b.since); c != 0 {
			return c
		}
		return cmp.Compare(a.pr.Number, b.pr.Number)
	})
}

// notPlanned tells a pull request no member plans why, once per gate: a
// new head of it changes nothing in the note, and costs nothing but the
// listing. Nothing is fetched, rendered or sent to a cluster for it.
func (w *PullRequests) notPlanned(ctx context.Context, g *group, st *groupState, f forge.Forge, pr forge.PullRequest, gate prGate) error {
	ps := st.prs[pr.Number]
	if p, ok := st.planned[pr.Number]; ok && p.gate == gate.key && ps != nil {
		ps.pr, ps.seen = pr, w.opts.Now()
		return nil
	}
	if ps == nil {
		ps = &prState{}
		st.prs[pr.Number] = ps
	}
	ps.pr, ps.seen, ps.queued, ps.secrets = pr, w.opts.Now(), false, nil
	ps.plan = notPlannedNote(gate)
	delete(st.waiting, pr.Number)
	if err := w.upsert(ctx, g, st, f, pr.Number); err != nil {
		return err
	}
	st.planned[pr.Number] = plannedHead{head: pr.HeadSHA, gate: gate.key}
	log.FromContext(ctx).V(1).Info("pull request not planned: it comes from a fork", "pullRequest", pr.Number, "author", pr.Author)
	return nil
}

// queue tells a pull request whose head waits for a later interval that
// it is queued, with ahead others before it, unless its comment holds the
// plan of that head already (made against clusters that changed since: it
// stays until the new one is made) or says it is queued. Written once per
// head: the queue only moves it forward.
func (w *PullRequests) queue(ctx context.Context, g *group, st *groupState, f forge.Forge, d dueHead, ahead int, interval time.Duration) error {
	n := d.pr.Number
	ps := st.prs[n]
	if ps == nil {
		// Not planned by this process (a restart): the comment may hold
		// the plan of this head, which a note must not replace.
		c, found, err := f.ReadComment(ctx, g.repo, n, PlanMarkerKey)
		if err = w.outcome(ctx, g, st, opRead, g.members, err); err != nil {
			return err
		}
		ps = &prState{pr: d.pr, seen: w.opts.Now(), url: c.URL, read: true}
		st.prs[n] = ps
		if plan, _ := planOfComment(c.Body); found && plan != "" && strings.Contains(plan, d.pr.HeadSHA) {
			ps.plan = plan
			return nil
		}
	}
	if ps.pr.HeadSHA == d.pr.HeadSHA && (ps.queued || strings.HasPrefix(ps.plan, planHeading)) {
		return nil
	}
	ps.pr, ps.seen, ps.queued, ps.secrets = d.pr, w.opts.Now(), true, nil
	ps.plan = queuedNote(perInterval(d.gate), ahead, interval)
	return w.upsert(ctx, g, st, f, n)
}

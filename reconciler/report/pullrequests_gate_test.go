package report

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/giteaserver"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
)

// forkPullRequest has a new user fork the fixture's repository, push a
// change and open a pull request from the fork.
func (f *restartFixture) forkPullRequest(ctx context.Context, user string) giteaserver.PullRequest {
	f.t.Helper()
	user += "-" + f.repo.Name
	if err := f.s.CreateUser(ctx, user); err != nil {
		f.t.Fatal(err)
	}
	fork, err := f.s.ForkAs(ctx, user, f.repo)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.s.Commit(ctx, fork, "change", map[string]string{"app/cm.yaml": "v: fork\n"}, "From a fork"); err != nil {
		f.t.Fatal(err)
	}
	pr, err := f.s.OpenPullRequestAs(ctx, user, f.repo, user+":change", "main", "From a fork")
	if err != nil {
		f.t.Fatal(err)
	}
	return pr
}

// tune changes the fixture's deployment's pull request settings.
func (f *restartFixture) tune(ctx context.Context, change func(*capstanv1.PullRequestReport)) {
	f.t.Helper()
	cd := &capstanv1.ClusterDeployment{}
	if err := f.c.Get(ctx, f.key, cd); err != nil {
		f.t.Fatal(err)
	}
	change(cd.Spec.Report.PullRequests)
	if err := f.c.Update(ctx, cd); err != nil {
		f.t.Fatal(err)
	}
}

// clocked gives w a clock that each call of the returned round moves a
// listing interval (the spec's 1s) before a round.
func clocked(ctx context.Context, w *PullRequests) func() {
	clock := time.Now()
	w.opts.Now = func() time.Time { return clock }
	return func() {
		clock = clock.Add(2 * time.Second)
		w.round(ctx)
	}
}

// A stranger's fork is not planned: the planner (fetch, render, dry run)
// is never called for it, its comment is one line saying why, written
// once. Made a collaborator, the same author's fork is planned, with its
// values hidden; forks: plan plans a stranger's too.
func TestPullRequestsFromForksAreGated(t *testing.T) {
	ctx := testContext(t)
	f := newRestartFixture(t, ctx)
	pr := f.forkPullRequest(ctx, "stranger")
	planner := &countingPlanner{shopPlanner: shopPlanner{f.diff}}
	tap := &forgeTap{gets: map[string]int{}, writes: map[string]int{}}
	w := f.watcher(tap, prometheus.NewRegistry())
	w.planner = planner
	round := clocked(ctx, w)

	note := f.until(ctx, w, pr.Number, "the note", func(b string) bool { return b != "" })
	if !strings.HasPrefix(note, notPlannedPrefix) || strings.Count(strings.TrimSpace(note), "\n") != 0 || !strings.Contains(note, "forks: plan") {
		t.Errorf("the comment on a stranger's fork is not the one-line note:\n%s", note)
	}
	for range 3 {
		round()
	}
	if got := planner.planned(); got != 0 {
		t.Errorf("a stranger's fork was planned %d times, want never", got)
	}
	if _, writes := tap.count(pr.Number); writes != 1 {
		t.Errorf("%d comment writes over four listings, want one: the note, written once", writes)
	}
	if plan, n := planOfComment(note); plan != "" || n != note {
		t.Errorf("the note read back = plan %q, note %q; want the note", plan, n)
	}

	// The author becomes a collaborator: a new process (the forge's
	// answer is kept a while) plans the fork, values hidden.
	user := "stranger-" + f.repo.Name
	if err := f.s.AddCollaborator(ctx, f.repo, user); err != nil {
		t.Fatal(err)
	}
	w = f.watcher(tap, prometheus.NewRegistry())
	w.planner = planner
	plan := f.until(ctx, w, pr.Number, "the plan", func(b string) bool { return strings.HasPrefix(b, planHeading) })
	if got := planner.planned(); got != 1 {
		t.Errorf("the collaborator's fork was planned %d times, want once", got)
	}
	if !strings.Contains(plan, "without their values") {
		t.Errorf("the plan of a fork does not say its values are hidden:\n%s", plan)
	}
	if !planner.decrypted() {
		t.Errorf("the collaborator's fork was planned without decryption; a collaborator could push here, so it decrypts")
	}

	// forks: plan plans a stranger's fork, without the decryption keys:
	// its author could route a decrypted value into what the plan shows.
	other := f.forkPullRequest(ctx, "outsider")
	f.tune(ctx, func(p *capstanv1.PullRequestReport) { p.Forks = capstanv1.ForksPlan })
	f.until(ctx, w, other.Number, "the plan with forks: plan", func(b string) bool { return strings.HasPrefix(b, planHeading) })
	if got := planner.planned(); got != 2 {
		t.Errorf("planned %d times, want twice (the collaborator's and, with forks: plan, the stranger's)", got)
	}
	if planner.decrypted() {
		t.Errorf("a stranger's fork was planned with decryption")
	}
}

// A deployment plans at most maxPlansPerInterval pull requests per
// interval; the others are told they are queued (once) and planned in the
// intervals that follow, the longest waiting first. A head planned and
// unchanged costs nothing and counts for nothing; a new head joins the
// back of the queue.
func TestPlansPerIntervalAreBounded(t *testing.T) {
	ctx := testContext(t)
	f := newRestartFixture(t, ctx)
	f.tune(ctx, func(p *capstanv1.PullRequestReport) { p.MaxPlansPerInterval = 1 })
	var prs []giteaserver.PullRequest
	for _, branch := range []string{"one", "two", "three"} {
		prs = append(prs, f.openPullRequest(ctx, branch))
	}
	planner := &countingPlanner{shopPlanner: shopPlanner{f.diff}}
	tap := &forgeTap{gets: map[string]int{}, writes: map[string]int{}}
	w := f.watcher(tap, prometheus.NewRegistry())
	w.planner = planner
	round := clocked(ctx, w)

	planned := func(want ...bool) {
		t.Helper()
		for i, pr := range prs {
			body := f.comment(ctx, pr.Number)
			if got := strings.HasPrefix(body, planHeading); got != want[i] {
				t.Errorf("pull request %s: planned = %v, want %v; comment:\n%s", []string{"one", "two", "three"}[i], got, want[i], body)
			}
			if !want[i] && !strings.HasPrefix(body, queuedPrefix) {
				t.Errorf("pull request %d is not planned and its comment does not say it is queued:\n%s", pr.Number, body)
			}
		}
	}
	round()
	if got := planner.planned(); got != 1 {
		t.Fatalf("the first interval planned %d pull requests, want 1", got)
	}
	planned(true, false, false)
	if third := f.comment(ctx, prs[2].Number); !strings.Contains(third, "1 pull request is planned per interval") || !strings.Contains(third, "1 is ahead") {
		t.Errorf("the queued note does not say the bound and the place:\n%s", third)
	}
	round()
	planned(true, true, false)
	round()
	planned(true, true, true)
	for range 2 {
		round()
	}
	if got := planner.planned(); got != 3 {
		t.Errorf("%d plans after every head was planned once and none changed, want 3", got)
	}
	// Three comments created (a plan, two queued notes), two edited once
	// (each note into its plan); nothing written again in the rounds
	// after.
	if _, writes := tap.count(prs[2].Number); writes != 5 {
		t.Errorf("%d comment writes, want 5: each queued note written once, then replaced by the plan", writes)
	}

	// A push to the first: planned again at the next interval.
	if _, err := f.s.Commit(ctx, f.repo, "one", map[string]string{"app/cm.yaml": "v: one again\n"}, "again"); err != nil {
		t.Fatal(err)
	}
	round()
	if got := planner.planned(); got != 4 {
		t.Errorf("%d plans after a push, want 4", got)
	}
}

// The gate, per deployment: branches of the repository are planned with
// values unless values: hide; forks only for a trusted author or with
// forks: plan, their values hidden unless values: show.
func TestGateOf(t *testing.T) {
	member := func(forks capstanv1.ForkPolicy, values capstanv1.ValuesPolicy) *capstanv1.ClusterDeployment {
		cd := &capstanv1.ClusterDeployment{}
		cd.Namespace, cd.Name = "fleet", "edge"
		cd.Spec.Report = &capstanv1.ReportSpec{PullRequests: &capstanv1.PullRequestReport{Forks: forks, Values: values}}
		return cd
	}
	branch := forge.PullRequest{Number: 1}
	stranger := forge.PullRequest{Number: 2, Fork: true, Author: "mallory"}
	collaborator := forge.PullRequest{Number: 3, Fork: true, Author: "carol", Association: forge.AssociationCollaborator}
	for _, tc := range []struct {
		name   string
		forks  capstanv1.ForkPolicy
		values capstanv1.ValuesPolicy
		pr     forge.PullRequest
		plan   bool
		hide   bool
	}{
		{"a branch of the repository, by default: planned, values shown", "", "", branch, true, false},
		{"a branch with values: hide: planned, values hidden", "", capstanv1.ValuesHide, branch, true, true},
		{"a stranger's fork, by default: not planned", "", "", stranger, false, true},
		{"a stranger's fork with forks: skip: not planned", capstanv1.ForksSkip, capstanv1.ValuesShow, stranger, false, true},
		{"a stranger's fork with forks: plan: planned, values hidden", capstanv1.ForksPlan, "", stranger, true, true},
		{"a stranger's fork with forks: plan and values: show: planned, values shown", capstanv1.ForksPlan, capstanv1.ValuesShow, stranger, true, false},
		{"a collaborator's fork, by default: planned, values hidden", "", "", collaborator, true, true},
		{"a collaborator's fork with values: show: planned, values shown", "", capstanv1.ValuesShow, collaborator, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := gateOf([]*capstanv1.ClusterDeployment{member(tc.forks, tc.values)}, tc.pr)
			planned, hidden := len(g.plan) == 1, false
			if planned {
				hidden = g.plan[0].hide
			} else {
				hidden = g.skip[0].hide
			}
			if planned != tc.plan || (planned && hidden != tc.hide) {
				t.Errorf("planned %v (values hidden %v), want planned %v (values hidden %v)", planned, hidden, tc.plan, tc.hide)
			}
		})
	}
}

package report

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/giteaserver"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
	"github.com/capstan-dev/capstan/stages"
)

// A real control plane and a real Gitea for the pull request tests of the
// package, started by the first test that needs them and stopped by
// TestMain (stopShared).
var (
	sharedOnce sync.Once
	sharedEnv  *testenv.Env
	sharedGit  *giteaserver.Server
	sharedErr  error
)

func controlPlaneAndGitea(t *testing.T) (*testenv.Env, *giteaserver.Server) {
	t.Helper()
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if sharedEnv, sharedErr = testenv.Start(ctx, testenv.Options{CRDDirs: []string{"../../manifests/crds"}}); sharedErr != nil {
			return
		}
		sharedGit, sharedErr = giteaserver.Start(ctx, giteaserver.Options{})
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return sharedEnv, sharedGit
}

func stopShared() error {
	var errs []error
	if sharedGit != nil {
		errs = append(errs, sharedGit.Stop())
	}
	if sharedEnv != nil {
		errs = append(errs, sharedEnv.Stop())
	}
	return errors.Join(errs...)
}

// shopPlanner plans every head as the shop fixture: the planner is the
// reconciler's, which this package does not import.
type shopPlanner struct{ diff *stages.PlanDiff }

func (p shopPlanner) PlanHead(context.Context, *capstanv1.ClusterDeployment, string, bool) (PlanResult, error) {
	return PlanResult{Diff: p.diff}, nil
}

// forgeTap counts the forge requests of one watcher and can fail those
// that read a pull request's comments.
type forgeTap struct {
	mu       sync.Mutex
	gets     map[string]int // comment listings, by path
	writes   map[string]int // comment edits and creations, by pull request path
	failRead bool
}

var commentsPath = regexp.MustCompile(`/issues/(\d+)/comments$`)

func (f *forgeTap) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	m := commentsPath.FindStringSubmatch(req.URL.Path)
	if m != nil && req.Method == http.MethodGet {
		f.gets[m[1]]++
		if f.failRead {
			f.mu.Unlock()
			return &http.Response{StatusCode: http.StatusBadGateway, Status: "502 Bad Gateway", Request: req,
				Header: http.Header{"Content-Type": {"application/json"}}, Body: http.NoBody}, nil
		}
	}
	if req.Method == http.MethodPatch || (m != nil && req.Method == http.MethodPost) {
		f.writes[req.Method]++
	}
	f.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

func (f *forgeTap) count(pr int64) (gets, writes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gets[fmt.Sprint(pr)], f.writes[http.MethodPatch] + f.writes[http.MethodPost]
}

// restartFixture is a deployment that reads main of a Gitea repository and
// reports to its pull requests.
type restartFixture struct {
	t    *testing.T
	c    client.Client
	s    *giteaserver.Server
	repo giteaserver.Repo
	key  client.ObjectKey
	diff *stages.PlanDiff
}

// kubeClient is a client of e that knows Capstan's kinds.
func kubeClient(t *testing.T, e *testenv.Env) client.Client {
	t.Helper()
	sch := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(sch), capstanv1.AddToScheme(sch)); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(e.Config, client.Options{Scheme: sch})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newRestartFixture(t *testing.T, ctx context.Context) *restartFixture {
	e, s := controlPlaneAndGitea(t)
	c := kubeClient(t, e)
	ns, err := e.CreateNamespace(ctx, "pr-restart")
	if err != nil {
		t.Fatal(err)
	}
	repo, err := s.CreateRepo(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, repo, "main", map[string]string{"app/cm.yaml": "v: 1\n"}, "v1"); err != nil {
		t.Fatal(err)
	}
	token, err := s.NewToken(ctx, "capstan-"+ns, "write:issue", "write:repository")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "forge-token", Namespace: ns},
		StringData: map[string]string{"token": token}}); err != nil {
		t.Fatal(err)
	}
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Name: "shop", Namespace: ns}, Spec: capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: s.CloneURL(repo), Ref: capstanv1.GitRef{Branch: "main"}}},
		Path:   "app",
		Report: &capstanv1.ReportSpec{PullRequests: &capstanv1.PullRequestReport{
			Provider: capstanv1.ForgeGitea, BaseURL: s.URL(),
			SecretRef: capstanv1.LocalObjectReference{Name: "forge-token"},
			Interval:  &metav1.Duration{Duration: time.Second},
		}},
	}}
	if err := c.Create(ctx, cd); err != nil {
		t.Fatal(err)
	}
	// A watcher serves every deployment of the cluster: one left behind
	// would have the watchers of later tests plan and read its pull
	// requests too, and spoil their counts.
	t.Cleanup(func() {
		if err := c.Delete(context.Background(), cd); err != nil {
			t.Errorf("delete ClusterDeployment %s/%s: %v", cd.Namespace, cd.Name, err)
		}
	})
	return &restartFixture{t: t, c: c, s: s, repo: repo, key: client.ObjectKeyFromObject(cd), diff: planFixture(t, "shop.json")}
}

// watcher is a fresh PullRequests, as a process that just started has:
// nothing in memory. It handles this fixture's repository alone.
func (f *restartFixture) watcher(tap *forgeTap, reg *prometheus.Registry) *PullRequests {
	f.t.Helper()
	w, err := NewPullRequests(PullRequestOptions{
		Interval:   100 * time.Millisecond,
		Registerer: reg,
		NewForge: func(cfg forge.Config) (forge.Forge, error) {
			cfg.HTTPClient = &http.Client{Transport: tap, Timeout: 30 * time.Second}
			return forge.New(cfg)
		},
	}, f.c, shopPlanner{f.diff})
	if err != nil {
		f.t.Fatal(err)
	}
	f.only(w)
	return w
}

// only makes w handle this fixture's repository alone: the deployments of
// the package's other tests, in the same control plane, are left out.
func (f *restartFixture) only(w *PullRequests) {
	f.t.Helper()
	name, err := forge.RepositoryFromURL(f.s.CloneURL(f.repo), f.s.URL())
	if err != nil {
		f.t.Fatal(err)
	}
	mine := PullRequestGroup(forge.ProviderGitea, f.s.URL(), name, "main")
	w.opts.Owns = func(group string) bool { return group == mine }
}

// openPullRequest pushes branch and opens a pull request from it.
func (f *restartFixture) openPullRequest(ctx context.Context, branch string) giteaserver.PullRequest {
	f.t.Helper()
	if _, err := f.s.Commit(ctx, f.repo, branch, map[string]string{"app/cm.yaml": "v: " + branch + "\n"}, branch); err != nil {
		f.t.Fatal(err)
	}
	pr, err := f.s.OpenPullRequest(ctx, f.repo, branch, "main", branch)
	if err != nil {
		f.t.Fatal(err)
	}
	return pr
}

// rollOut gives the deployment the status of a rollout of commit sha:
// Ready, or with its last stage in progress.
func (f *restartFixture) rollOut(ctx context.Context, sha string, ready bool) {
	f.t.Helper()
	cd := &capstanv1.ClusterDeployment{}
	if err := f.c.Get(ctx, f.key, cd); err != nil {
		f.t.Fatal(err)
	}
	start := metav1.Now()
	cd.Status.Revision, cd.Status.ObservedGeneration = "main@sha1:"+sha, cd.Generation
	cd.Status.Stages = []capstanv1.StageStatus{{Name: "Config", State: capstanv1.StageInProgress, StartedAt: &start, Message: "waiting for the shop"}}
	cond := metav1.Condition{Type: capstanv1.ConditionReady, Status: metav1.ConditionFalse, Reason: "Progressing", Message: "stage Config", LastTransitionTime: start}
	if ready {
		cd.Status.Stages[0] = capstanv1.StageStatus{Name: "Config", State: capstanv1.StageReady, StartedAt: &start, FinishedAt: &start}
		cond = metav1.Condition{Type: capstanv1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Succeeded", Message: "Ready", LastTransitionTime: start}
	}
	cd.Status.Conditions = []metav1.Condition{cond}
	if err := f.c.Status().Update(ctx, cd); err != nil {
		f.t.Fatal(err)
	}
}

// comment is the body of Capstan's comment on pull request n, without the
// marker line; "" for none.
func (f *restartFixture) comment(ctx context.Context, n int64) string {
	f.t.Helper()
	cs, err := f.s.Comments(ctx, f.repo, n)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, c := range cs {
		if body, ok := strings.CutPrefix(c.Body, PlanMarker+"\n"); ok {
			return strings.ReplaceAll(body, "\r\n", "\n")
		}
	}
	return ""
}

// until runs the watcher's rounds until pull request n's comment satisfies
// cond, and returns it.
func (f *restartFixture) until(ctx context.Context, w *PullRequests, n int64, what string, cond func(string) bool) string {
	f.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		w.round(ctx)
		body := f.comment(ctx, n)
		if cond(body) {
			return body
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the comment on pull request %d: %s: not within a minute; it is:\n%s", n, what, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func failures(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	return counted(t, reg, metrics.PullRequestReportFailures, reason)
}

// counted sums the series of a counter family with the given reason.
func counted(t *testing.T, reg *prometheus.Registry, family, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// A pull request planned by one process and merged: the process that
// follows its rollout after a restart (a fresh watcher, nothing in memory)
// reads the plan back from the comment and keeps it under the rollout,
// also when its first read fails (the comment waits, it is not given a
// note in the plan's place). A comment whose plan was lost before stays
// with its note, read once.
func TestPullRequestPlanSurvivesARestart(t *testing.T) {
	ctx := testContext(t)
	f := newRestartFixture(t, ctx)

	// One process plans the pull request, then goes away.
	pr := f.openPullRequest(ctx, "scale")
	first := f.watcher(&forgeTap{gets: map[string]int{}, writes: map[string]int{}}, prometheus.NewRegistry())
	planned := f.until(ctx, first, pr.Number, "the plan", func(b string) bool { return strings.HasPrefix(b, planHeading) })
	merge, err := f.s.MergePullRequest(ctx, f.repo, pr.Number)
	if err != nil {
		t.Fatal(err)
	}
	f.rollOut(ctx, merge, false)

	// The next process cannot read the comment at first.
	tap := &forgeTap{gets: map[string]int{}, writes: map[string]int{}, failRead: true}
	reg := prometheus.NewRegistry()
	next := f.watcher(tap, reg)
	deadline := time.Now().Add(time.Minute)
	for failures(t, reg, "server_error") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the failed read of the comment was not counted within a minute")
		}
		next.round(ctx)
	}
	if got := f.comment(ctx, pr.Number); got != planned {
		t.Errorf("the comment changed while it could not be read back:\n%s", got)
	}
	if sts, err := f.s.CommitStatuses(ctx, f.repo, merge); err != nil || len(sts) == 0 || sts[0].State != "pending" {
		t.Errorf("commit statuses of the merge while the comment could not be read = %+v, %v; want pending: the rollout goes on", sts, err)
	}
	tap.mu.Lock()
	tap.failRead = false
	tap.mu.Unlock()
	rolled := f.until(ctx, next, pr.Number, "the rollout above the plan", func(b string) bool { return strings.HasPrefix(b, rolloutHeading) })
	if !strings.HasSuffix(rolled, planSeparator+planned) || strings.Contains(rolled, notePrefix) {
		t.Errorf("after the restart the comment does not end with the plan it had:\n%s\n--- the plan\n%s", rolled, planned)
	}
	f.rollOut(ctx, merge, true)
	ready := f.until(ctx, next, pr.Number, "the rollout Ready", func(b string) bool { return strings.Contains(b, ":white_check_mark:") })
	if !strings.HasSuffix(ready, planSeparator+planned) {
		t.Errorf("once Ready the comment does not end with the plan it had:\n%s", ready)
	}

	// A comment whose plan an earlier restart lost, in the layout of the
	// Capstan of before: the note stays, and no plan is made up.
	lost := f.openPullRequest(ctx, "lost")
	gitea, err := forge.NewGitea(forge.Config{BaseURL: f.s.URL(), Token: f.s.Token()})
	if err != nil {
		t.Fatal(err)
	}
	old := rolloutHeading + fmt.Sprint(lost.Number) + "\n\nMerged as `abc`.\n\n#### :hourglass_flowing_sand: `x/shop`: Progressing\n" + oldPlanSeparator + noteRestarted
	if _, err := gitea.UpsertComment(ctx, f.repo.String(), lost.Number, PlanMarkerKey, old); err != nil {
		t.Fatal(err)
	}
	merge2, err := f.s.MergePullRequest(ctx, f.repo, lost.Number)
	if err != nil {
		t.Fatal(err)
	}
	f.rollOut(ctx, merge2, false)
	tap = &forgeTap{gets: map[string]int{}, writes: map[string]int{}}
	third := f.watcher(tap, prometheus.NewRegistry())
	kept := f.until(ctx, third, lost.Number, "the rollout of the merge", func(b string) bool { return strings.Contains(b, shortSHA(merge2)) })
	if !strings.HasSuffix(kept, planSeparator+noteRestarted) || strings.Contains(kept, planHeading) {
		t.Errorf("the comment whose plan was lost:\n%s\nwant it to end with the note %q and hold no plan", kept, noteRestarted)
	}
	f.rollOut(ctx, merge2, true)
	f.until(ctx, third, lost.Number, "the rollout Ready", func(b string) bool { return strings.Contains(b, ":white_check_mark:") })
	// Each comment write lists the comments once; reading back, once in all.
	if gets, writes := tap.count(lost.Number); gets != writes+1 {
		t.Errorf("%d listings of the comments for %d writes: the comment was read back more than once", gets, writes)
	}
}

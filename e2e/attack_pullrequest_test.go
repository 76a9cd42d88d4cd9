package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/giteaserver"
	"github.com/capstan-dev/capstan/reconciler"
)

// The attacks of a pull-request author (docs/tenancy.md): a stranger's
// fork must not get a dry run with Capstan's identity, nor read live
// values in a public comment.

// liveEndpoint is a live value the deployment applies: no comment on a
// pull request from a fork, nor one with values: hide, may show it.
const liveEndpoint = "https://db-7f3a.internal.corp.example:5432"

// appFiles is a one-stage overlay: a ConfigMap with an endpoint, and, for
// a fork's change, a ConfigMap fork-probe that only a plan of that change
// would dry-run.
func appFiles(endpoint string, probe bool) map[string]string {
	resources := "[config.yaml]"
	files := map[string]string{
		"clusters/app/config.yaml": fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: app-settings
  namespace: ${NS}
  labels: {capstan.dev/stage: Config}
data: {endpoint: %q}
`, endpoint),
	}
	if probe {
		resources = "[config.yaml, probe.yaml]"
		files["clusters/app/probe.yaml"] = `apiVersion: v1
kind: ConfigMap
metadata:
  name: fork-probe
  namespace: ${NS}
  labels: {capstan.dev/stage: Config}
data: {from: fork}
`
	}
	files["clusters/app/kustomization.yaml"] = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: " + resources + "\n"
	return files
}

// forgeRequests counts the watcher's requests to the forge by method and
// path.
type forgeRequests struct {
	mu   sync.Mutex
	seen map[string]int
}

func (f *forgeRequests) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	if f.seen == nil {
		f.seen = map[string]int{}
	}
	f.seen[req.Method+" "+req.URL.Path]++
	f.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

// count sums the requests of method whose path ends in suffix.
func (f *forgeRequests) count(method, suffix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for k, v := range f.seen {
		m, path, _ := strings.Cut(k, " ")
		if m == method && strings.HasSuffix(path, suffix) {
			n += v
		}
	}
	return n
}

// prAttack is a Ready deployment reading main of a Gitea repository, its
// daemon's API requests and forge requests counted.
type prAttack struct {
	s       *giteaserver.Server
	c       client.Client
	ns      string
	repo    giteaserver.Repo
	api     *requestCounter
	forge   *forgeRequests
	pulls   string // the path suffix of the listing of pull requests
	comment func(n int64) string
}

// newPRAttack starts a daemon and a deployment "app" with the given pull
// request settings, and waits until it is Ready.
func newPRAttack(t *testing.T, tune func(*capstanv1.PullRequestReport)) *prAttack {
	t.Helper()
	s := realGitea(t)
	ctx := context.Background()
	a := &prAttack{s: s, c: newClient(t), ns: newNamespace(t), forge: &forgeRequests{}}
	var err error
	if a.repo, err = s.CreateRepo(ctx, a.ns); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, a.repo, "main", appFiles(liveEndpoint, false), "the app"); err != nil {
		t.Fatal(err)
	}
	a.pulls = "/repos/" + a.repo.String() + "/pulls"
	giteaSecrets(t, s, a.c, a.ns)
	_, a.api = startDaemonWith(t, nil, func(o *reconciler.Options) {
		o.Report.Interval = time.Second
		o.Report.ForgeTransport = a.forge
	})
	pr := &capstanv1.PullRequestReport{
		Provider: capstanv1.ForgeGitea, BaseURL: s.URL(),
		SecretRef: capstanv1.LocalObjectReference{Name: "forge-token"},
		Interval:  &metav1.Duration{Duration: time.Second},
	}
	if tune != nil {
		tune(pr)
	}
	createDeployment(t, a.c, a.ns, "app", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: s.CloneURL(a.repo), Ref: capstanv1.GitRef{Branch: "main"},
			SecretRef: &capstanv1.LocalObjectReference{Name: "git-auth"},
		}},
		Path:       "clusters/app",
		Substitute: map[string]string{"NS": a.ns},
		Interval:   &metav1.Duration{Duration: 500 * time.Millisecond},
		Stages:     []capstanv1.StageSpec{{Name: "Config"}},
		Report:     &capstanv1.ReportSpec{PullRequests: pr},
	})
	waitDeployment(t, a.c, a.ns, "app", "Ready", isReady)
	return a
}

// forkPullRequest has a new user fork the repository, push a change of the
// endpoint with the probe, and open a pull request from the fork.
func (a *prAttack) forkPullRequest(t *testing.T, user string) giteaserver.PullRequest {
	t.Helper()
	ctx := context.Background()
	user = user + "-" + a.ns
	if err := a.s.CreateUser(ctx, user); err != nil {
		t.Fatal(err)
	}
	fork, err := a.s.ForkAs(ctx, user, a.repo)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.s.Commit(ctx, fork, "probe", appFiles("https://attacker.example:5432", true), "A small change"); err != nil {
		t.Fatal(err)
	}
	pr, err := a.s.OpenPullRequestAs(ctx, user, a.repo, user+":probe", "main", "A small change")
	if err != nil {
		t.Fatal(err)
	}
	return pr
}

// listedAgain waits until the watcher has listed the pull requests n more
// times: whatever it does with a pull request, it has done by then.
func (a *prAttack) listedAgain(t *testing.T, n int) {
	t.Helper()
	from := a.forge.count(http.MethodGet, a.pulls)
	waitFor(t, fmt.Sprintf("%d more listings of the pull requests", n), func() (bool, error) {
		return a.forge.count(http.MethodGet, a.pulls) >= from+n, nil
	})
}

// probed counts the requests to the API server about the fork's probe:
// dry-run applies and GETs. A plan of the fork's change makes both.
func (a *prAttack) probed() (dryRuns, gets int) {
	return a.api.total("PATCH(dry-run)", "/configmaps/fork-probe"), a.api.listsOf("/configmaps/fork-probe")
}

// A stranger forks the repository and opens a pull request: by default it
// is not planned. It gets a one-line comment saying why, written once, and
// Capstan sends no request about its objects to the API server (before
// the gate, its change was dry-run with Capstan's identity and its plan
// commented).
func TestAttackForkPullRequestIsNotPlanned(t *testing.T) {
	a := newPRAttack(t, nil)
	pr := a.forkPullRequest(t, "stranger")
	comment := waitComment(t, a.s, a.repo, pr.Number, "the fork is not planned", func(b string) bool {
		return strings.Contains(b, "did not plan this pull request") && strings.Contains(b, "fork")
	})
	a.listedAgain(t, 3)
	if dryRuns, gets := a.probed(); dryRuns != 0 || gets != 0 {
		t.Errorf("the fork's change reached the API server: %d dry-run applies and %d GETs of its ConfigMap, want none", dryRuns, gets)
	}
	body := strings.TrimPrefix(comment.Body, "<!-- capstan:plan -->\n")
	if lines := strings.Split(strings.TrimSpace(body), "\n"); len(lines) != 1 {
		t.Errorf("the comment has %d lines, want one:\n%s", len(lines), body)
	}
	for _, leak := range []string{liveEndpoint, "Capstan plan", "app-settings"} {
		if strings.Contains(comment.Body, leak) {
			t.Errorf("the comment on the fork's pull request holds %q:\n%s", leak, comment.Body)
		}
	}
	comments := fmt.Sprintf("/issues/%d/comments", pr.Number)
	if created, edited := a.forge.count(http.MethodPost, comments), a.forge.count(http.MethodPatch, "/issues/comments/"+fmt.Sprint(comment.ID)); created != 1 || edited != 0 {
		t.Errorf("the comment was created %d times and edited %d times over three listings, want written once", created, edited)
	}
}

// With forks: plan, the fork is planned (a dry run of its change), and its
// comment lists the fields it changes without their values: the live
// endpoint stays out of the public comment (before, it showed
// "data.endpoint: <live> -> <new>").
func TestAttackForkPullRequestPlannedHidesValues(t *testing.T) {
	a := newPRAttack(t, func(p *capstanv1.PullRequestReport) { p.Forks = capstanv1.ForksPlan })
	pr := a.forkPullRequest(t, "outsider")
	comment := waitComment(t, a.s, a.repo, pr.Number, "the plan of the fork", func(b string) bool {
		return strings.Contains(b, "Capstan plan") && strings.Contains(b, pr.HeadSHA)
	})
	if dryRuns, _ := a.probed(); dryRuns == 0 {
		t.Errorf("the fork's pull request was planned with forks: plan, but its ConfigMap was not dry-run")
	}
	if !strings.Contains(comment.Body, "data.endpoint: (changed)") {
		t.Errorf("the plan does not name the changed field without its value:\n%s", comment.Body)
	}
	for _, leak := range []string{liveEndpoint, "attacker.example"} {
		if strings.Contains(comment.Body, leak) {
			t.Errorf("the plan of a fork shows the value %q:\n%s", leak, comment.Body)
		}
	}
}

// values: hide hides values from the plans of branches of the repository
// too: the field's path is there, neither its live value nor the new one.
func TestAttackValuesHide(t *testing.T) {
	a := newPRAttack(t, func(p *capstanv1.PullRequestReport) { p.Values = capstanv1.ValuesHide })
	ctx := context.Background()
	head, err := a.s.Commit(ctx, a.repo, "move-db", appFiles("https://db-new.internal.corp.example:5432", false), "Move the database")
	if err != nil {
		t.Fatal(err)
	}
	pr, err := a.s.OpenPullRequest(ctx, a.repo, "move-db", "main", "Move the database")
	if err != nil {
		t.Fatal(err)
	}
	comment := waitComment(t, a.s, a.repo, pr.Number, "the plan", func(b string) bool {
		return strings.Contains(b, "Capstan plan") && strings.Contains(b, head)
	})
	if !strings.Contains(comment.Body, "data.endpoint: (changed)") {
		t.Errorf("the plan does not name the changed field:\n%s", comment.Body)
	}
	for _, leak := range []string{liveEndpoint, "db-new.internal"} {
		if strings.Contains(comment.Body, leak) {
			t.Errorf("values: hide, but the plan shows %q:\n%s", leak, comment.Body)
		}
	}
}

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/giteaserver"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/reconciler/report"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
)

// forgeRequest is one request a replica's pull request watcher sent to
// the forge, with the status it got.
type forgeRequest struct {
	replica, method, path string
	status                int
	at                    time.Time
	// body is what a comment write sent.
	body string
}

// forgeAudit records the requests of every replica's pull request watcher
// (reconciler.ReportOptions.ForgeTransport): the forge cannot tell
// replicas apart, they share its token. It can also answer in the forge's
// place, to make it fail.
type forgeAudit struct {
	mu    sync.Mutex
	reqs  []forgeRequest
	fault func(*http.Request) (int, string)
}

// transport carries replica's forge requests, recorded.
func (a *forgeAudit) transport(replica string) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		a.mu.Lock()
		fault := a.fault
		a.mu.Unlock()
		var resp *http.Response
		var err error
		var body []byte
		if req.Method != http.MethodGet && req.Body != nil && commentWrite.MatchString(req.URL.Path) {
			if body, err = io.ReadAll(req.Body); err != nil {
				return nil, err
			}
			req.Body.Close()
			req.Body = io.NopCloser(bytes.NewReader(body))
		}
		if code, body := 0, ""; fault != nil {
			if code, body = fault(req); code != 0 {
				resp = &http.Response{StatusCode: code, Status: fmt.Sprintf("%d %s", code, http.StatusText(code)), Request: req,
					Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body))}
			}
		}
		if resp == nil {
			resp, err = http.DefaultTransport.RoundTrip(req)
		}
		r := forgeRequest{replica: replica, method: req.Method, path: req.URL.Path, at: time.Now(), body: string(body)}
		if err == nil {
			r.status = resp.StatusCode
		}
		a.mu.Lock()
		a.reqs = append(a.reqs, r)
		a.mu.Unlock()
		return resp, err
	})
}

func (a *forgeAudit) setFault(fault func(*http.Request) (int, string)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fault = fault
}

// commentWrite matches the Gitea API's comment writes: a POST creates a
// comment on an issue or pull request, a PATCH edits one.
var commentWrite = regexp.MustCompile(`^/api/v1/repos/([^/]+/[^/]+)/issues/(?:\d+/comments|comments/\d+)$`)

// of returns the requests about repo (owner/name) since from; with writes,
// only the comment writes the forge accepted.
func (a *forgeAudit) of(repo string, from time.Time, writes bool) []forgeRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []forgeRequest
	for _, r := range a.reqs {
		if r.at.Before(from) || !strings.HasPrefix(r.path, "/api/v1/repos/"+repo+"/") {
			continue
		}
		if writes && (r.method == http.MethodGet || r.status/100 != 2 || !commentWrite.MatchString(r.path)) {
			continue
		}
		out = append(out, r)
	}
	return out
}

// count returns how many of rs each replica sent, by method.
func count(rs []forgeRequest) map[string]int {
	out := map[string]int{}
	for _, r := range rs {
		out[r.replica+" "+r.method]++
	}
	return out
}

// cmOverlay is one ConfigMap whose data says version.
func cmOverlay(version string) map[string]string {
	return map[string]string{
		"app/kustomization.yaml": "resources: [cm.yaml]\n",
		"app/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: \"cm-${NAME}\", namespace: \"${NS}\"}\n" +
			"data: {version: \"v" + version + "\"}\n",
	}
}

// prRepo is a repository whose pull requests one replica handles.
type prRepo struct {
	repo  giteaserver.Repo
	group string
	owner string
	pr    giteaserver.PullRequest
	// comment is the Capstan comment on pr.
	comment giteaserver.Comment
}

// Three sharded replicas, three repositories whose pull requests hashing
// gives one to each: every pull request gets one comment, made by the
// replica that owns its repository, and no other replica as much as asks
// the forge about it. The owner of one is then killed (cut off the API
// server, not off the forge, so that it could still write if it believed
// itself the owner); a push to its pull request is planned by the
// replica that takes the repository over, which edits the same comment
// rather than making another, and the killed replica writes nothing.
// The heir is killed in turn and the pull request merged: the last
// replica, which never planned it, edits the comment with the rollout and
// keeps the plan under it, read back from the comment.
func TestShardingPullRequestCommentsHaveOneWriter(t *testing.T) {
	const (
		leaseDuration = 3 * time.Second
		renewPeriod   = 500 * time.Millisecond
		prInterval    = time.Second
	)
	s := realGitea(t)
	ctx := context.Background()
	c := newClient(t)
	ns := newNamespace(t)
	token := giteaSecrets(t, s, c, ns)

	audit := &shardAudit{ns: ns}
	views := newViewMonitor(t)
	forges := &forgeAudit{}
	daemons := map[string]*reconciler.Daemon{}
	logs := map[string]*logBuffer{}
	all := []string{"replica-a", "replica-b", "replica-c"}
	for _, id := range all {
		logs[id] = &logBuffer{}
		daemons[id], _ = startDaemonWith(t, nil, func(o *reconciler.Options) {
			o.Config = audit.wrap(id, o.Config)
			o.Sharding = reconciler.ShardingOptions{Enabled: true, Namespace: ns, Group: "e2e-pr", Identity: id,
				LeaseDuration: leaseDuration, RenewPeriod: renewPeriod}
			o.Report.Interval = prInterval
			o.Report.ForgeTransport = forges.transport(id)
			o.Logger = logs[id].logger()
		})
		views.set(id, daemons[id])
	}
	see := func(ids, want []string) func() (bool, error) { return membersSeen(daemons, ids, want) }
	waitFor(t, "every replica to see the three", see(all, all))

	// One repository per replica: names tried in turn until hashing gave
	// each replica one.
	repos := map[string]*prRepo{} // by owner
	for i := 0; len(repos) < len(all) && i < 200; i++ {
		repo := giteaserver.Repo{Owner: giteaserver.AdminUser, Name: fmt.Sprintf("%s-r%d", ns, i)}
		name, err := forge.RepositoryFromURL(s.CloneURL(repo), s.URL())
		if err != nil {
			t.Fatal(err)
		}
		group := report.PullRequestGroup(forge.ProviderGitea, s.URL(), name, "main")
		if owner := reconciler.PullRequestOwner(group, all); repos[owner] == nil {
			repos[owner] = &prRepo{repo: repo, group: group, owner: owner}
		}
	}
	if len(repos) != len(all) {
		t.Fatalf("no repository name for each replica among 200: %d", len(repos))
	}
	for _, r := range repos {
		if _, err := s.CreateRepo(ctx, r.repo.Name); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Commit(ctx, r.repo, "main", cmOverlay("1"), "v1"); err != nil {
			t.Fatal(err)
		}
		createDeployment(t, c, ns, r.repo.Name, capstanv1.ClusterDeploymentSpec{
			Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: s.CloneURL(r.repo), Ref: capstanv1.GitRef{Branch: "main"},
				SecretRef: &capstanv1.LocalObjectReference{Name: "git-auth"}}},
			Path:       "app",
			Substitute: map[string]string{"NS": ns, "NAME": r.repo.Name},
			Interval:   &metav1.Duration{Duration: time.Minute},
			Report: &capstanv1.ReportSpec{PullRequests: &capstanv1.PullRequestReport{
				Provider: capstanv1.ForgeGitea, BaseURL: s.URL(),
				SecretRef: capstanv1.LocalObjectReference{Name: "forge-token"},
				Interval:  &metav1.Duration{Duration: prInterval},
			}},
		})
	}
	for _, r := range repos {
		waitDeployment(t, c, ns, r.repo.Name, "Ready", isReady)
	}

	// 1. A pull request in each repository: one comment each, by its owner.
	began := time.Now()
	for _, r := range repos {
		head, err := s.Commit(ctx, r.repo, "change", cmOverlay("2"), "v2")
		if err != nil {
			t.Fatal(err)
		}
		if r.pr, err = s.OpenPullRequest(ctx, r.repo, "change", "main", "v2"); err != nil {
			t.Fatal(err)
		}
		r.pr.HeadSHA = head
	}
	for _, r := range repos {
		r.comment = waitComment(t, s, r.repo, r.pr.Number, "the plan of "+r.repo.String(), func(b string) bool {
			return strings.Contains(b, r.pr.HeadSHA) && strings.Contains(b, "data.version: v1 -> v2")
		})
	}
	// The forge may show a comment before its writer has the answer.
	waitFor(t, "every comment write answered", func() (bool, error) {
		for _, r := range repos {
			if len(forges.of(r.repo.String(), began, true)) == 0 {
				return false, fmt.Errorf("%s: none yet", r.repo)
			}
		}
		return true, nil
	})
	// A replica starved of CPU for a lease duration is rightly taken for
	// dead and its groups move: then only the count of comments holds.
	flaps := views.changed(began, time.Now(), all, all...)
	if flaps != "" {
		t.Logf("membership changed without the test changing it:%s checking only that each pull request has one comment", flaps)
	}
	for _, r := range repos {
		writes := count(forges.of(r.repo.String(), began, true))
		if flaps == "" && (!only(writes, r.owner+" POST") || writes[r.owner+" POST"] != 1) {
			t.Errorf("%s: comment writes %v, want one POST by its owner %s and nothing else", r.repo, writes, r.owner)
		}
		if posts(writes) != 1 {
			t.Errorf("%s: comment writes %v, want one POST in all", r.repo, writes)
		}
		if who := count(forges.of(r.repo.String(), time.Time{}, false)); flaps == "" && (len(replicasIn(who)) != 1 || replicasIn(who)[0] != r.owner) {
			t.Errorf("%s: forge requests by %v, want its owner %s only", r.repo, who, r.owner)
		}
	}

	// 2. Kill the owner of one repository's pull requests; push to its
	// pull request: the replica that takes it over edits the comment.
	victim := all[2]
	r := repos[victim]
	rest := []string{all[0], all[1]}
	heir := reconciler.PullRequestOwner(r.group, rest)
	killed := time.Now()
	audit.kill(victim)
	head2, err := s.Commit(ctx, r.repo, "change", cmOverlay("3"), "v3")
	if err != nil {
		t.Fatal(err)
	}
	edited := waitComment(t, s, r.repo, r.pr.Number, "the plan of the new head, by the replica that took over", func(b string) bool {
		return strings.Contains(b, head2) && strings.Contains(b, "data.version: v1 -> v3")
	})
	took := time.Since(killed)
	waitFor(t, "the others to see the killed replica gone", see(rest, rest))
	t.Logf("%s killed: %s took its pull requests over and edited the comment %s later (bound: lease duration %s + pull request interval %s = %s)",
		victim, heir, took.Round(time.Millisecond), leaseDuration, prInterval, leaseDuration+prInterval)
	if edited.ID != r.comment.ID {
		t.Errorf("the push after the takeover made comment %d, want comment %d edited", edited.ID, r.comment.ID)
	}
	waitFor(t, "the edit answered", func() (bool, error) { return len(forges.of(r.repo.String(), killed, true)) > 0, nil })
	if got := count(forges.of(r.repo.String(), killed, true)); !only(got, heir+" PATCH") {
		t.Errorf("%s after the kill: comment writes %v, want PATCHes by %s only", r.repo, got, heir)
	}
	for _, w := range forges.of(r.repo.String(), killed, false) {
		if w.replica == victim && w.method != http.MethodGet {
			t.Errorf("the killed replica still wrote to the forge: %s %s (HTTP %d) %s after the kill:\n%s",
				w.method, w.path, w.status, w.at.Sub(killed).Round(time.Millisecond), w.body)
		}
	}
	for owner, other := range repos {
		if owner == victim {
			continue
		}
		if got := count(forges.of(other.repo.String(), killed, true)); len(got) != 0 {
			t.Errorf("%s (unchanged, owned by %s) got comment writes after the kill: %v", other.repo, owner, got)
		}
	}

	// 3. Kill the heir too, then merge the pull request: the last replica,
	// which never planned it, follows the rollout and edits the comment,
	// which keeps the plan the heir wrote (read back from the comment, not
	// replaced by a note that the plan is not shown).
	last := rest[0]
	if last == heir {
		last = rest[1]
	}
	planned := ourComments(t, s, r.repo, r.pr.Number)[0].Body
	_, plan, _ := strings.Cut(strings.ReplaceAll(planned, "\r\n", "\n"), "\n")
	killed2 := time.Now()
	audit.kill(heir)
	merge, err := s.MergePullRequest(ctx, r.repo, r.pr.Number)
	if err != nil {
		t.Fatal(err)
	}
	// The deployment reads main once a minute: a short interval has it
	// read it now.
	cd := getDeployment(t, c, ns, r.repo.Name)
	if err := c.Patch(ctx, cd, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"interval":"1s"}}`))); err != nil {
		t.Fatal(err)
	}
	rolled := waitComment(t, s, r.repo, r.pr.Number, "the rollout of the merge, Ready, by the last replica", func(b string) bool {
		return strings.Contains(b, "Capstan rollout of #") && strings.Contains(b, merge[:12]) && strings.Contains(b, ":white_check_mark:")
	})
	t.Logf("%s killed too: %s followed the merge's rollout into the comment %s later", heir, last, time.Since(killed2).Round(time.Millisecond))
	if rolled.ID != r.comment.ID {
		t.Errorf("the rollout went to comment %d, want comment %d", rolled.ID, r.comment.ID)
	}
	if body := strings.ReplaceAll(rolled.Body, "\r\n", "\n"); !strings.HasSuffix(body, "\n"+plan) || strings.Contains(body, "is not shown") {
		t.Errorf("after the takeover the comment does not end with the plan %s wrote:\n%s\n--- the plan\n%s", heir, body, plan)
	}
	// As in step 1, the forge shows the edit before its writer has the answer.
	waitFor(t, "the rollout's edit answered", func() (bool, error) { return len(forges.of(r.repo.String(), killed2, true)) > 0, nil })
	if got := count(forges.of(r.repo.String(), killed2, true)); !only(got, last+" PATCH") {
		t.Errorf("%s after the heir's kill: comment writes %v, want PATCHes by %s only", r.repo, got, last)
	}

	// No token in any replica's logs.
	for id, l := range logs {
		for _, secret := range []string{token, s.Token()} {
			if strings.Contains(l.String(), secret) {
				t.Errorf("a token is in the logs of %s", id)
			}
		}
	}
}

// posts counts the POSTs of a count, whoever sent them.
func posts(counts map[string]int) int {
	n := 0
	for k, v := range counts {
		if strings.HasSuffix(k, " "+http.MethodPost) {
			n += v
		}
	}
	return n
}

// only reports whether got holds want and nothing else.
func only(got map[string]int, want string) bool {
	return len(got) == 1 && got[want] > 0
}

// replicasIn returns the replicas of a count, sorted.
func replicasIn(counts map[string]int) []string {
	var out []string
	for k := range counts {
		id, _, _ := strings.Cut(k, " ")
		out = append(out, id)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

package forge

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"code.gitea.io/sdk/gitea"

	"github.com/capstan-dev/capstan/internal/giteaserver"
)

// One real Gitea for the package, started by the first test that needs it
// (the GitHub and GitLab tests do not) and stopped by TestMain, which also
// stops the control plane of secret_test.go.
var (
	giteaOnce sync.Once
	giteaSrv  *giteaserver.Server
	giteaErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if env != nil {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	if giteaSrv != nil {
		if err := giteaSrv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.Exit(code)
}

// realGitea returns the package's Gitea, failing the test (never skipping
// it) when the binary is missing: the error says to run `make gitea`.
func realGitea(t *testing.T) *giteaserver.Server {
	t.Helper()
	giteaOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		giteaSrv, giteaErr = giteaserver.Start(ctx, giteaserver.Options{})
	})
	if giteaErr != nil {
		t.Fatal(giteaErr)
	}
	return giteaSrv
}

// runs numbers the runs of the tests in this process: the names of
// repositories and tokens are unique on the package's Gitea, and a test
// run again (-count) must not meet the ones of its earlier run.
var runs atomic.Int64

// uniqueName is name with the number of this run.
func uniqueName(name string) string { return fmt.Sprintf("%s-%d", name, runs.Add(1)) }

// giteaRepo creates a repository on the real Gitea with an open pull
// request from branch "bump" into main, and one into "release".
func giteaRepo(t *testing.T, ctx context.Context, s *giteaserver.Server, name string) (giteaserver.Repo, giteaserver.PullRequest) {
	t.Helper()
	repo, err := s.CreateRepo(ctx, uniqueName(name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, repo, "release", map[string]string{"RELEASE": "1\n"}, "Release branch"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, repo, "bump", map[string]string{"clusters/a/workers.yaml": "replicas: 5\n"}, "Scale workload-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, repo, "backport", map[string]string{"RELEASE": "2\n"}, "Backport"); err != nil {
		t.Fatal(err)
	}
	pr, err := s.OpenPullRequest(ctx, repo, "bump", "main", "Scale workload-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenPullRequest(ctx, repo, "backport", "release", "Backport"); err != nil {
		t.Fatal(err)
	}
	return repo, pr
}

// TestGiteaAgainstRealServer runs the Gitea provider against a real Gitea,
// with a token that has only the scopes docs/forges.md lists.
func TestGiteaAgainstRealServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := realGitea(t)
	repo, pr := giteaRepo(t, ctx, s, "infra")
	token, err := s.NewToken(ctx, uniqueName("capstan"), "write:issue", "write:repository")
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewGitea(Config{BaseURL: s.URL(), Token: token})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("the open pull request against main is listed", func(t *testing.T) {
		prs, err := f.OpenPullRequests(ctx, repo.String(), "main")
		if err != nil {
			t.Fatal(err)
		}
		want := []PullRequest{{Number: pr.Number, Title: "Scale workload-a", HeadSHA: pr.HeadSHA, HeadRef: "bump",
			HeadFetchRef: fmt.Sprintf("refs/pull/%d/head", pr.Number), BaseRef: "main", URL: pr.URL, Author: giteaserver.AdminUser}}
		if fmt.Sprint(prs) != fmt.Sprint(want) {
			t.Errorf("open pull requests:\n got %+v\nwant %+v", prs, want)
		}
	})

	t.Run("upserting keeps one comment, edited in place", func(t *testing.T) {
		ours := func() []string {
			cs, err := s.Comments(ctx, repo, pr.Number)
			if err != nil {
				t.Fatal(err)
			}
			var bodies []string
			for _, c := range cs {
				if strings.HasPrefix(c.Body, Marker("plan")) {
					bodies = append(bodies, c.Body)
				}
			}
			return bodies
		}
		assertUpserts(t, ctx, f, repo.String(), pr.Number, ours)
	})

	t.Run("the comment is read back past a page of others, and no other is taken for it", func(t *testing.T) {
		other, otherPR := giteaRepo(t, ctx, s, "read-back")
		admin, err := gitea.NewClient(s.URL(), gitea.SetToken(s.Token()), gitea.SetContext(ctx), gitea.SetGiteaVersion(""))
		if err != nil {
			t.Fatal(err)
		}
		write := func(body string) {
			t.Helper()
			if _, _, err := admin.CreateIssueComment(other.Owner, other.Name, otherPR.Number, gitea.CreateIssueCommentOption{Body: body}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range giteaPageSize + 5 {
			write(fmt.Sprintf("comment %d", i))
		}
		assertReadComment(t, ctx, f, other.String(), otherPR.Number, write)
	})

	t.Run("the commit status is visible on the commit", func(t *testing.T) {
		if err := f.SetCommitStatus(ctx, repo.String(), pr.HeadSHA, Status{State: StatePending, Description: "stage workers: 1 of 3 machines"}); err != nil {
			t.Fatal(err)
		}
		if err := f.SetCommitStatus(ctx, repo.String(), pr.HeadSHA, Status{State: StateSuccess, Description: "Ready", TargetURL: pr.URL}); err != nil {
			t.Fatal(err)
		}
		sts, err := s.CommitStatuses(ctx, repo, pr.HeadSHA)
		if err != nil {
			t.Fatal(err)
		}
		if len(sts) == 0 {
			t.Fatal("no commit status")
		}
		// Newest first.
		if got := sts[0]; got.State != "success" || got.Context != DefaultStatusContext || got.Description != "Ready" || got.TargetURL != pr.URL {
			t.Errorf("latest status = %+v, want success named %s linking to the pull request", got, DefaultStatusContext)
		}
	})
	// Last: it merges the pull request.
	t.Run("the merge commit leads to its merged pull request", func(t *testing.T) {
		merge, err := s.MergePullRequest(ctx, repo, pr.Number)
		if err != nil {
			t.Fatal(err)
		}
		prs, err := f.PullRequestsForCommit(ctx, repo.String(), merge)
		if err != nil {
			t.Fatal(err)
		}
		if len(prs) != 1 || prs[0].Number != pr.Number || !prs[0].Merged || prs[0].MergeCommitSHA != merge || !prs[0].CameFrom(merge) {
			t.Errorf("pull requests of merge commit %s = %+v, want pull request %d, merged by it", merge, prs, pr.Number)
		}
		// Gitea answers only for merge commits; another commit has none.
		if prs, err := f.PullRequestsForCommit(ctx, repo.String(), "0000000000000000000000000000000000000001"); err != nil || len(prs) != 0 {
			t.Errorf("pull requests of a commit of none = %+v, %v; want none", prs, err)
		}
	})
}

// TestGiteaErrorsAgainstRealServer pins what an operator reads when the
// token is wrong or lacks a scope, and that the token is not in it.
func TestGiteaErrorsAgainstRealServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := realGitea(t)
	repo, pr := giteaRepo(t, ctx, s, "errors")

	planted, err := NewGitea(Config{BaseURL: s.URL(), Token: plantedToken})
	if err != nil {
		t.Fatal(err)
	}
	_, err = planted.UpsertComment(ctx, repo.String(), pr.Number, "plan", "x")
	assertForgeError(t, err, plantedToken, []string{"gitea", fmt.Sprintf("comment on pull request %d of %s", pr.Number, repo), "401", "check that the Secret holds a valid"})

	readOnly, err := s.NewToken(ctx, uniqueName("read-only"), "read:repository", "read:issue")
	if err != nil {
		t.Fatal(err)
	}
	ro, err := NewGitea(Config{BaseURL: s.URL(), Token: readOnly})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ro.UpsertComment(ctx, repo.String(), pr.Number, "plan", "x")
	assertForgeError(t, err, readOnly, []string{"gitea", "403", "write:issue"})
	err = ro.SetCommitStatus(ctx, repo.String(), pr.HeadSHA, Status{State: StateSuccess})
	assertForgeError(t, err, readOnly, []string{"gitea", "set commit status capstan on commit " + pr.HeadSHA, "403", "write:repository"})

	_, err = ro.OpenPullRequests(ctx, "capstan-admin/missing", "main")
	assertForgeError(t, err, readOnly, []string{"gitea", "capstan-admin/missing", "not found", s.URL()})

	down, err := NewGitea(Config{BaseURL: "http://127.0.0.1:1", Token: plantedToken})
	if err != nil {
		t.Fatal(err)
	}
	_, err = down.OpenPullRequests(ctx, repo.String(), "main")
	assertForgeError(t, err, plantedToken, []string{"gitea", "no answer from http://127.0.0.1:1", "check the base URL"})
}

// TestGiteaForksAgainstRealServer pins what a real Gitea says of pull
// requests from forks: a stranger's is a fork with no association, a
// collaborator's fork is trusted, the owner's branch is no fork, and
// the association is asked once per author for a while.
func TestGiteaForksAgainstRealServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := realGitea(t)
	repo, own := giteaRepo(t, ctx, s, "forks")
	stranger, collab := uniqueName("stranger"), uniqueName("collab")
	var prs []giteaserver.PullRequest
	for _, user := range []string{stranger, collab} {
		if err := s.CreateUser(ctx, user); err != nil {
			t.Fatal(err)
		}
		fork, err := s.ForkAs(ctx, user, repo)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Commit(ctx, fork, "change", map[string]string{"clusters/a/workers.yaml": "replicas: 9\n"}, "From "+user); err != nil {
			t.Fatal(err)
		}
		pr, err := s.OpenPullRequestAs(ctx, user, repo, user+":change", "main", "From "+user)
		if err != nil {
			t.Fatal(err)
		}
		prs = append(prs, pr)
	}
	if err := s.AddCollaborator(ctx, repo, collab); err != nil {
		t.Fatal(err)
	}
	token, err := s.NewToken(ctx, uniqueName("capstan"), "write:issue", "write:repository")
	if err != nil {
		t.Fatal(err)
	}
	lookups := &countingTransport{}
	f, err := NewGitea(Config{BaseURL: s.URL(), Token: token, HTTPClient: &http.Client{Transport: lookups}})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		got, err := f.OpenPullRequests(ctx, repo.String(), "main")
		if err != nil {
			t.Fatal(err)
		}
		want := map[int64]string{
			own.Number:    "fork=false author=" + giteaserver.AdminUser + " association= trusted=false",
			prs[0].Number: "fork=true author=" + stranger + " association= trusted=false",
			prs[1].Number: "fork=true author=" + collab + " association=collaborator trusted=true",
		}
		if len(got) != len(want) {
			t.Fatalf("open pull requests: %+v, want %d", got, len(want))
		}
		for _, pr := range got {
			if line := fmt.Sprintf("fork=%v author=%s association=%s trusted=%v", pr.Fork, pr.Author, pr.Association, pr.TrustedAuthor()); line != want[pr.Number] {
				t.Errorf("pull request %d: %s, want %s", pr.Number, line, want[pr.Number])
			}
		}
	}
	if n := lookups.count("/collaborators/"); n != 2 {
		t.Errorf("%d collaborator lookups for two listings of two forks, want 2 (once per author)", n)
	}
}

// countingTransport counts the requests whose path contains a string.
type countingTransport struct {
	mu    sync.Mutex
	paths []string
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.paths = append(c.paths, req.URL.Path)
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

func (c *countingTransport) count(part string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, p := range c.paths {
		if strings.Contains(p, part) {
			n++
		}
	}
	return n
}

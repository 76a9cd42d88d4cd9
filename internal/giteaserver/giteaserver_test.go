package giteaserver

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"code.gitea.io/sdk/gitea"

	"github.com/capstan-dev/capstan/sources/webhook"
)

// TestVersionMatchesBuild keeps Version in step with the module
// e2e/gitea/build.sh builds, which names the cache directory.
func TestVersionMatchesBuild(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "e2e", "gitea", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	want := "require code.gitea.io/gitea " + Version
	if !strings.Contains(string(b), want) {
		t.Fatalf("e2e/gitea/go.mod does not contain %q: bump Version with the module", want)
	}
}

// TestPullRequestRoundTrip starts Gitea, pushes a branch, opens a pull
// request, comments on it, sets a commit status, merges it and receives
// the push webhook of the merge.
func TestPullRequestRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})

	// Capstan's own webhook receiver, with the secret the hook signs with.
	pushes := &recordingTrigger{pushes: make(chan [2]string, 8)}
	receiver, err := webhook.NewHandler(webhook.Options{GiteaSecret: []byte("hook-secret"), Trigger: pushes})
	if err != nil {
		t.Fatal(err)
	}
	defer receiver.Close()
	hook := httptest.NewServer(receiver)
	defer hook.Close()

	repo, err := s.CreateRepo(ctx, "infra")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddPushWebhook(ctx, repo, hook.URL+"/gitea", "hook-secret"); err != nil {
		t.Fatal(err)
	}
	head, err := s.Commit(ctx, repo, "bump-workers", map[string]string{"clusters/a/workers.yaml": "replicas: 3\n"}, "Bump workers")
	if err != nil {
		t.Fatal(err)
	}
	pr, err := s.OpenPullRequest(ctx, repo, "bump-workers", "main", "Bump workers")
	if err != nil {
		t.Fatal(err)
	}
	if pr.HeadSHA != head {
		t.Errorf("pull request head = %s, want the pushed commit %s", pr.HeadSHA, head)
	}

	c, err := s.client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.CreateIssueComment(repo.Owner, repo.Name, pr.Number, gitea.CreateIssueCommentOption{Body: "looks good"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.CreateStatus(repo.Owner, repo.Name, head, gitea.CreateStatusOption{State: gitea.StatusSuccess, Context: "capstan", Description: "plan ok"}); err != nil {
		t.Fatal(err)
	}
	comments, err := s.Comments(ctx, repo, pr.Number)
	if err != nil {
		t.Fatal(err)
	}
	if len(comments) != 1 || comments[0].Body != "looks good" || comments[0].Author != AdminUser {
		t.Errorf("comments = %+v, want one by %s", comments, AdminUser)
	}
	statuses, err := s.CommitStatuses(ctx, repo, head)
	if err != nil {
		t.Fatal(err)
	}
	if len(statuses) != 1 || statuses[0].State != "success" || statuses[0].Context != "capstan" {
		t.Errorf("statuses = %+v, want one success named capstan", statuses)
	}

	merge, err := s.MergePullRequest(ctx, repo, pr.Number)
	if err != nil {
		t.Fatal(err)
	}
	if merge == "" || merge == head {
		t.Errorf("merge commit = %q, want a new commit", merge)
	}
	// The branch push came before the merge; wait for the receiver to
	// trigger main of the repository, which only the merge pushes to.
	for {
		select {
		case p := <-pushes.pushes:
			if p == [2]string{s.CloneURL(repo), "main"} {
				return
			}
		case <-ctx.Done():
			t.Fatalf("the receiver got no signed push of %s main for the merge commit %s: %v; gitea log:\n%s", repo, merge, ctx.Err(), s.LogTail())
		}
	}
}

// recordingTrigger follows every branch of every repository and records
// the pushes the receiver accepts.
type recordingTrigger struct{ pushes chan [2]string }

func (r *recordingTrigger) Match(urls []string, branch string) (string, bool) {
	for _, u := range urls {
		if strings.HasSuffix(u, ".git") {
			return u, true
		}
	}
	return "", false
}

func (r *recordingTrigger) Trigger(_ context.Context, repoURL, branch string) {
	r.pushes <- [2]string{repoURL, branch}
}

// TestStartWithoutBinary says how to get the binary instead of skipping.
func TestStartWithoutBinary(t *testing.T) {
	_, err := Start(context.Background(), Options{BinDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "make gitea") {
		t.Fatalf("Start without a binary: error %v, want one that says to run `make gitea`", err)
	}
}

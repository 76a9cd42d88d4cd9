package webhook

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/sources/git"
)

// gitTrigger follows one branch of one real git repository and, when
// triggered, asks it for its revision, as the reconciler's poll would.
type gitTrigger struct {
	src  *git.Source
	revs chan string
}

func (g *gitTrigger) Match(urls []string, branch string) (string, bool) {
	for _, u := range urls {
		if SameRepository(u, g.src.URL()) && (branch == "" || branch == g.src.Branch()) {
			return g.src.URL(), true
		}
	}
	return "", false
}

func (g *gitTrigger) Trigger(ctx context.Context, _, _ string) {
	rev, err := g.src.Revision(ctx)
	if err != nil {
		rev = "error: " + err.Error()
	}
	g.revs <- rev
}

// The webhook test with real parts: a commit lands on a real git
// server, GitHub's push webhook arrives signed, and the trigger sees the
// new revision. The latency from POST to the new revision is logged, not
// asserted.
func TestGitHubPushReachesANewRevision(t *testing.T) {
	srv, err := gitserver.New("", gitserver.Options{Username: "capstan", Password: "pw-Zq81"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if _, err := srv.CreateRepo("infra"); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Commit("infra", "main", map[string]string{"a.yaml": "v1"}, "one"); err != nil {
		t.Fatal(err)
	}
	src, err := git.New(git.Options{URL: srv.HTTPURL("infra"), Branch: "main", Auth: git.Auth{Username: "capstan", Password: "pw-Zq81"}})
	if err != nil {
		t.Fatal(err)
	}
	trig := &gitTrigger{src: src, revs: make(chan string, 16)}
	_, base := serve(t, trig)

	second, err := srv.Commit("infra", "main", map[string]string{"a.yaml": "v2"}, "two")
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"ref": "refs/heads/main", "after": "` + second + `", "repository": {"clone_url": "` + srv.HTTPURL("infra") + `"}}`)
	start := time.Now()
	code, resp := send(t, base, github("push", body))
	if code != http.StatusAccepted {
		t.Fatalf("POST = %d %s, want 202", code, resp)
	}
	select {
	case rev := <-trig.revs:
		if !strings.HasSuffix(rev, second) {
			t.Fatalf("revision after the push = %q, want main@sha1:%s", rev, second)
		}
		t.Logf("push webhook to new revision: %v", time.Since(start))
	case <-time.After(30 * time.Second):
		t.Fatal("no revision within 30s of the push webhook")
	}
}

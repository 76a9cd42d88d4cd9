package gitserver

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// git runs the git CLI as a client would, isolated from the user's config.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = gitEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestHTTPCloneCountsRequestsAndNeedsAuth(t *testing.T) {
	s, err := New(t.TempDir(), Options{Username: "alice", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	url, err := s.CreateRepo("infra")
	if err != nil {
		t.Fatal(err)
	}
	hash, err := s.Commit("infra", "main", map[string]string{"a.yaml": "a: 1\n"}, "first")
	if err != nil {
		t.Fatal(err)
	}
	if s.Requests() != 0 {
		t.Fatalf("Commit made %d HTTP requests, want 0", s.Requests())
	}

	authed := strings.Replace(url, "http://", "http://alice:s3cret@", 1)
	got := git(t, "", "ls-remote", authed, "refs/heads/main")
	if !strings.HasPrefix(got, hash) {
		t.Errorf("ls-remote = %q, want %s", got, hash)
	}
	// The git CLI asks without credentials first and retries after the
	// 401, so both attempts are counted; go-git sends them at once.
	if n := s.RequestsTo("/infra.git/info/refs"); n < 1 || n != s.Requests()-s.RequestsTo("/infra.git/git-upload-pack") {
		t.Errorf("requests to info/refs = %d of %d (log %v)", n, s.Requests(), s.RequestLog())
	}

	cmd := exec.Command("git", "ls-remote", url)
	cmd.Env = gitEnv()
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("ls-remote without credentials succeeded: %s", out)
	}

	work := filepath.Join(t.TempDir(), "work")
	git(t, "", "clone", "--quiet", authed, work)
	if data, err := os.ReadFile(filepath.Join(work, "a.yaml")); err != nil || string(data) != "a: 1\n" {
		t.Fatalf("cloned a.yaml = %q, %v", data, err)
	}
	if err := os.WriteFile(filepath.Join(work, "b.yaml"), []byte("b: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, work, "add", "b.yaml")
	git(t, work, "commit", "--quiet", "-m", "pushed over http")
	git(t, work, "push", "--quiet", "origin", "main")
	pushed := git(t, work, "rev-parse", "HEAD")
	onServer := git(t, s.RepoPath("infra"), "rev-parse", "refs/heads/main")
	if pushed != onServer {
		t.Errorf("server main = %s after push, want %s", onServer, pushed)
	}
}

func TestCommitOverlaysDeletesAndBranches(t *testing.T) {
	s, err := New("", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.CreateRepo("r"); err != nil {
		t.Fatal(err)
	}
	dir := s.RepoPath("r")
	if _, err := s.Commit("r", "main", map[string]string{"keep": "k", "drop": "d"}, "one"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit("r", "main", map[string]string{"drop": Deleted, "new": "n"}, "two"); err != nil {
		t.Fatal(err)
	}
	if got := git(t, dir, "ls-tree", "--name-only", "main"); got != "keep\nnew" {
		t.Errorf("main tree = %q, want keep and new", got)
	}
	if _, err := s.CommitFiles("r", "feature", []File{
		{Path: "link", Content: "keep", Symlink: true},
		{Path: "run.sh", Content: "#!/bin/sh\n", Executable: true},
	}, "three"); err != nil {
		t.Fatal(err)
	}
	tree := git(t, dir, "ls-tree", "feature")
	for _, want := range []string{"120000 blob", "100755 blob", "\tkeep", "\tnew"} {
		if !strings.Contains(tree, want) {
			t.Errorf("feature tree %q lacks %q", tree, want)
		}
	}
	if got := git(t, dir, "log", "--format=%an <%ae> %s", "-1", "feature"); got != AuthorName+" <"+AuthorEmail+"> three" {
		t.Errorf("author line = %q", got)
	}
}

func TestDaemonServesGitProtocol(t *testing.T) {
	s, err := New("", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.CreateRepo("infra"); err != nil {
		t.Fatal(err)
	}
	hash, err := s.Commit("infra", "main", map[string]string{"a": "a"}, "one")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.StartDaemon(ctx); err != nil {
		t.Fatal(err)
	}
	if got := git(t, "", "ls-remote", s.GitURL("infra"), "refs/heads/main"); !strings.HasPrefix(got, hash) {
		t.Errorf("ls-remote over git:// = %q, want %s", got, hash)
	}
}

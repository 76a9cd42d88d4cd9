package report

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/capstan-dev/capstan/sources/git"
)

// gitOut runs the git CLI on a repository of the server.
func gitOut(t *testing.T, repo string, args ...string) string {
	t.Helper()
	out, err := gitCmd(repo, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func gitCmd(repo string, args ...string) *exec.Cmd {
	cmd := exec.Command("git", args...)
	cmd.Env = append(os.Environ(), "GIT_DIR="+server.RepoPath(repo), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	return cmd
}

func httpPush(repo string, files map[string]string) pushRequest {
	req := pushRequest{
		url: server.HTTPURL(repo), branch: "capstan/status",
		auth:  git.Auth{Username: testUser, Password: testPassword},
		files: map[string][]byte{}, message: "status: test\n",
		name: "Capstan", email: "capstan@localhost", retries: 5, now: time.Now,
	}
	for p, c := range files {
		req.files[p] = []byte(c)
	}
	return req
}

func TestPushCreatesTheBranchThenBuildsOnIt(t *testing.T) {
	ctx := testContext(t)
	repo := newRepo(t)
	mainBefore := gitOut(t, repo, "rev-parse", "main")

	res, err := push(ctx, httpPush(repo, map[string]string{"status/ns/a.yaml": "phase: Progressing\n"}))
	if err != nil {
		t.Fatal(err)
	}
	if res.commit.IsZero() || len(res.changed) != 1 {
		t.Fatalf("first push = %+v, want a commit changing one file", res)
	}
	if got := gitOut(t, repo, "rev-list", "--count", "capstan/status"); got != "1" {
		t.Errorf("a new status branch has %s commits, want 1 (no history of main)", got)
	}
	if got := gitOut(t, repo, "ls-tree", "-r", "--name-only", "capstan/status"); got != "status/ns/a.yaml" {
		t.Errorf("the new status branch holds %q, want only the status file", got)
	}
	if got := gitOut(t, repo, "log", "-1", "--format=%an <%ae>", "capstan/status"); got != "Capstan <capstan@localhost>" {
		t.Errorf("author = %q", got)
	}

	// The same content again: nothing to commit.
	res, err = push(ctx, httpPush(repo, map[string]string{"status/ns/a.yaml": "phase: Progressing\n"}))
	if err != nil {
		t.Fatal(err)
	}
	if !res.commit.IsZero() {
		t.Errorf("an unchanged file made commit %s", res.commit)
	}

	// Another file and a change: one commit on top, both files there.
	res, err = push(ctx, httpPush(repo, map[string]string{"status/ns/a.yaml": "phase: Ready\n", "status/other/b.yaml": "phase: Progressing\n"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.changed) != 2 {
		t.Errorf("changed %v, want both files", res.changed)
	}
	if got := gitOut(t, repo, "rev-list", "--count", "capstan/status"); got != "2" {
		t.Errorf("status branch has %s commits, want 2", got)
	}
	if got := gitOut(t, repo, "show", "capstan/status:status/ns/a.yaml"); got != "phase: Ready" {
		t.Errorf("status/ns/a.yaml = %q", got)
	}
	if got := gitOut(t, repo, "rev-parse", "main"); got != mainBefore {
		t.Errorf("main moved from %s to %s", mainBefore, got)
	}
}

// Someone else pushes to the status branch between Capstan's fetch and
// its push: the push is written again on top of their commit, and both
// changes are kept.
func TestPushAfterLosingARace(t *testing.T) {
	ctx := testContext(t)
	repo := newRepo(t)
	if _, err := push(ctx, httpPush(repo, map[string]string{"status/ns/a.yaml": "phase: Progressing\n"})); err != nil {
		t.Fatal(err)
	}
	req := httpPush(repo, map[string]string{"status/ns/a.yaml": "phase: Ready\n"})
	var theirs []string
	req.beforePush = func(attempt int) {
		if attempt < 2 {
			h, err := server.Commit(repo, "capstan/status", map[string]string{"notes/by-hand-" + string(rune('0'+attempt)) + ".md": "mine\n"}, "by hand")
			if err != nil {
				t.Error(err)
			}
			theirs = append(theirs, h)
		}
	}
	res, err := push(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.raced != 2 {
		t.Errorf("raced = %d, want 2", res.raced)
	}
	files := gitOut(t, repo, "ls-tree", "-r", "--name-only", "capstan/status")
	if files != "notes/by-hand-0.md\nnotes/by-hand-1.md\nstatus/ns/a.yaml" {
		t.Errorf("status branch holds\n%s\nwant both hand-made notes and the status file", files)
	}
	if got := gitOut(t, repo, "show", "capstan/status:status/ns/a.yaml"); got != "phase: Ready" {
		t.Errorf("status/ns/a.yaml = %q", got)
	}
	for _, h := range theirs {
		// Their commits are ancestors of the tip: nothing was forced over them.
		cmd := exec.Command("git", "merge-base", "--is-ancestor", h, "capstan/status")
		cmd.Env = append(os.Environ(), "GIT_DIR="+server.RepoPath(repo))
		if err := cmd.Run(); err != nil {
			t.Errorf("commit %s by someone else is not in the status branch's history: %v", h, err)
		}
	}
}

func TestPushGivesUpAfterItsRetries(t *testing.T) {
	ctx := testContext(t)
	repo := newRepo(t)
	if _, err := push(ctx, httpPush(repo, map[string]string{"status/ns/a.yaml": "phase: Progressing\n"})); err != nil {
		t.Fatal(err)
	}
	req := httpPush(repo, map[string]string{"status/ns/a.yaml": "phase: Ready\n"})
	req.retries = 2
	n := 0
	req.beforePush = func(int) {
		n++
		if _, err := server.Commit(repo, "capstan/status", map[string]string{"notes/n.md": strings.Repeat("x", n)}, "by hand"); err != nil {
			t.Error(err)
		}
	}
	_, err := push(ctx, req)
	if !errors.Is(err, errRaced) {
		t.Fatalf("push = %v, want a lost race after its retries", err)
	}
	if got := gitOut(t, repo, "show", "capstan/status:status/ns/a.yaml"); got != "phase: Progressing" {
		t.Errorf("status/ns/a.yaml = %q, want the first push's", got)
	}
}

func TestPushRefusedCredentials(t *testing.T) {
	ctx := testContext(t)
	repo := newRepo(t)
	req := httpPush(repo, map[string]string{"status/ns/a.yaml": "x\n"})
	req.auth.Password = "pw-wrong-and-secret"
	_, err := push(ctx, req)
	if err == nil {
		t.Fatal("push with a wrong password succeeded")
	}
	if strings.Contains(err.Error(), "pw-wrong-and-secret") {
		t.Errorf("error quotes the password: %v", err)
	}
	if got := gitOut(t, repo, "branch", "--list", "capstan/status"); got != "" {
		t.Errorf("the status branch exists after a refused push: %q", got)
	}
}

func TestPushOverSSH(t *testing.T) {
	ctx := testContext(t)
	repo := newRepo(t)
	sessions := server.SSHSessions()
	req := pushRequest{
		url: server.SSHURL(repo), branch: "capstan/status",
		auth:  git.Auth{SSHPrivateKey: sshClientKey, SSHKnownHosts: sshKnownHost},
		files: map[string][]byte{"status/ns/a.yaml": []byte("phase: Ready\n")}, message: "status\n",
		name: "Capstan", email: "capstan@localhost", retries: 1, now: time.Now,
	}
	if _, err := push(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := gitOut(t, repo, "show", "capstan/status:status/ns/a.yaml"); got != "phase: Ready" {
		t.Errorf("status/ns/a.yaml = %q", got)
	}
	if server.SSHSessions() == sessions {
		t.Error("the push did not go over ssh")
	}
	// A host key that known_hosts does not hold is refused.
	_, other, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	otherPub, err := ssh.NewPublicKey(other.Public())
	if err != nil {
		t.Fatal(err)
	}
	host := strings.Fields(string(sshKnownHost))[0]
	req.auth.SSHKnownHosts = []byte(knownhosts.Line([]string{host}, otherPub) + "\n")
	req.files["status/ns/a.yaml"] = []byte("phase: Stalled\n")
	if _, err := push(ctx, req); err == nil || !strings.Contains(err.Error(), "knownhosts: key mismatch") {
		t.Errorf("push to a host whose key known_hosts does not hold = %v, want a host key mismatch", err)
	}
}

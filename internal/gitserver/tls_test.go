package gitserver

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/internal/testca"
)

func TestHTTPSServesWithTheGivenCertificate(t *testing.T) {
	ca := testca.Must(t, "gitserver-test-ca")
	cert, err := ca.ServerCertificate()
	if err != nil {
		t.Fatal(err)
	}
	s, err := New("", Options{TLSCertificate: &cert})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	url, err := s.CreateRepo("infra")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(url, "https://127.0.0.1:") {
		t.Fatalf("repository URL %s, want https://127.0.0.1:PORT/...", url)
	}
	hash, err := s.Commit("infra", "main", map[string]string{"a.yaml": "a: 1\n"}, "first")
	if err != nil {
		t.Fatal(err)
	}

	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("git", "ls-remote", url, "refs/heads/main")
	cmd.Env = append(gitEnv(), "GIT_SSL_CAINFO="+caFile)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), hash) {
		t.Errorf("ls-remote trusting the CA = %q, %v; want %s", out, err, hash)
	}

	// Without the CA the client refuses the server: the certificate is
	// really checked, not accepted by default.
	cmd = exec.Command("git", "ls-remote", url)
	cmd.Env = append(gitEnv(), "GIT_SSL_CAINFO="+filepath.Join(t.TempDir(), "none.crt"))
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("ls-remote without the CA succeeded: %s", out)
	}
}

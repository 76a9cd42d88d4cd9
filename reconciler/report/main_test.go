package report

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/capstan-dev/capstan/internal/gitserver"
)

// The credentials of the shared server; the password is odd so that a
// test can search for it.
const (
	testUser     = "capstan"
	testPassword = "pw-Rk42-keep-out-of-git"
)

// server is the git server of this package's tests: http-backend with
// basic auth, and ssh (receive-pack included). Each test makes its own
// repository.
var (
	server                     *gitserver.Server
	sshClientKey, sshKnownHost []byte
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	s, err := gitserver.New("", gitserver.Options{Username: testUser, Password: testPassword})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	knownHosts, err := s.StartSSH(ctx, signer.PublicKey())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	server, sshClientKey, sshKnownHost = s, pem.EncodeToMemory(block), knownHosts
	defer func() {
		if err := stopShared(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	return m.Run()
}

var repoSeq atomic.Int64

// newRepo creates a repository named after the test with one commit on
// main, and returns its name.
func newRepo(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("%s-%d", strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()), repoSeq.Add(1))
	if _, err := server.CreateRepo(name); err != nil {
		t.Fatal(err)
	}
	if _, err := server.Commit(name, "main", map[string]string{"clusters/a.yaml": "kind: ClusterDeployment\n"}, "initial"); err != nil {
		t.Fatal(err)
	}
	return name
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

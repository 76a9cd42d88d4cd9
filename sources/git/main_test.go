package git

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/gitserver"
)

// The credentials of the shared server. The password is long and odd so
// that a test can search error messages for it.
const (
	testUser     = "capstan"
	testPassword = "pw-Zq81-never-print-me"
)

// server is the one git server of this package's tests: http-backend with
// basic auth, git daemon and ssh. Each test makes its own repository.
var server *gitserver.Server

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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.StartDaemon(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	key, signer, err := newSSHKey()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	knownHosts, err := s.StartSSH(ctx, signer.PublicKey())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	server, sshClientKey, sshKnownHosts = s, key, knownHosts
	return m.Run()
}

var repoSeq atomic.Int64

// newRepo creates a repository named after the test, commits files to main
// and returns the repository's name and the commit's hash.
func newRepo(t *testing.T, files map[string]string) (string, string) {
	t.Helper()
	name := fmt.Sprintf("%s-%d", strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()), repoSeq.Add(1))
	if _, err := server.CreateRepo(name); err != nil {
		t.Fatal(err)
	}
	hash, err := server.Commit(name, "main", files, "initial")
	if err != nil {
		t.Fatal(err)
	}
	return name, hash
}

// httpSource is a Source for repo over http with the right credentials.
func httpSource(t *testing.T, repo string, mutate ...func(*Options)) *Source {
	t.Helper()
	opts := Options{URL: server.HTTPURL(repo), Auth: Auth{Username: testUser, Password: testPassword}}
	for _, m := range mutate {
		m(&opts)
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// readAll returns every file of fsys as path to content.
func readAll(t *testing.T, fsys fs.FS) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(fsys, p)
		out[p] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func assertFiles(t *testing.T, fsys fs.FS, want map[string]string) {
	t.Helper()
	got := readAll(t, fsys)
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s = %q, want %q", p, got[p], w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected file %s", p)
		}
	}
}

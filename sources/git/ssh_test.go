package git

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"net/url"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/capstan-dev/capstan/sources"
)

// The ssh credentials of the shared server, set up in TestMain.
var (
	sshClientKey  []byte // PEM
	sshKnownHosts []byte
)

// newSSHKey returns a fresh ed25519 key as PEM and as an ssh signer.
func newSSHKey() ([]byte, ssh.Signer, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		return nil, nil, err
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(block), signer, nil
}

// testSSHKeys returns a client key and a known_hosts line with a random
// host key for host, for tests that never connect.
func testSSHKeys(t *testing.T, host string) (key, knownHosts []byte) {
	t.Helper()
	key, _, err := newSSHKey()
	if err != nil {
		t.Fatal(err)
	}
	_, hostKey, err := newSSHKey()
	if err != nil {
		t.Fatal(err)
	}
	return key, []byte(knownhosts.Line([]string{host}, hostKey.PublicKey()) + "\n")
}

func TestSSH(t *testing.T) {
	repo, hash := newRepo(t, clusterFiles)
	sshURL := server.SSHURL(repo)
	u, err := url.Parse(sshURL)
	if err != nil {
		t.Fatal(err)
	}
	otherKey, _, err := newSSHKey()
	if err != nil {
		t.Fatal(err)
	}
	_, otherHostKey, err := newSSHKey()
	if err != nil {
		t.Fatal(err)
	}
	wrongKnownHosts := []byte(knownhosts.Line([]string{knownhosts.Normalize(u.Host)}, otherHostKey.PublicKey()) + "\n")

	t.Run("revision and fetch", func(t *testing.T) {
		ctx := testContext(t)
		src, err := New(Options{URL: sshURL, Auth: Auth{SSHPrivateKey: sshClientKey, SSHKnownHosts: sshKnownHosts}})
		if err != nil {
			t.Fatal(err)
		}
		sessions := server.SSHSessions()
		rev, err := src.Revision(ctx)
		if err != nil || rev != "main@sha1:"+hash {
			t.Fatalf("Revision = %q, %v; want main@sha1:%s", rev, err, hash)
		}
		if got := server.SSHSessions() - sessions; got != 1 {
			t.Errorf("Revision ran %d git commands over ssh, want 1", got)
		}
		art, err := src.Fetch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if art.Revision != rev {
			t.Errorf("Artifact.Revision = %q, want %q", art.Revision, rev)
		}
		assertFiles(t, art.FS, clusterFiles)
	})

	tests := []struct {
		name string
		auth Auth
		want string
	}{
		{name: "a key the server does not know", auth: Auth{SSHPrivateKey: otherKey, SSHKnownHosts: sshKnownHosts},
			want: "the server refused the ssh key"},
		{name: "a host key that does not match known_hosts", auth: Auth{SSHPrivateKey: sshClientKey, SSHKnownHosts: wrongKnownHosts},
			want: "does not match known_hosts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			src, err := New(Options{URL: sshURL, Auth: tt.auth})
			if err != nil {
				t.Fatal(err)
			}
			_, err = src.Revision(ctx)
			if !errors.Is(err, sources.ErrAuth) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Revision = %v, want sources.ErrAuth saying %q", err, tt.want)
			}
		})
	}
}

package git

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/capstan-dev/capstan/sources"
)

// runCmd runs a command with extra environment and returns its trimmed
// output, failing t on error.
func runCmd(t *testing.T, env []string, stdin string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// signHead puts on main of repo a commit of the same tree signed with
// `git commit-tree -S` and the given git config, as a developer's signed
// commit would be, and returns its hash.
func signHead(t *testing.T, repo string, env []string, config ...string) string {
	t.Helper()
	env = append(env, "GIT_DIR="+server.RepoPath(repo),
		"GIT_AUTHOR_NAME=Capstan Test", "GIT_AUTHOR_EMAIL=test@capstan.dev",
		"GIT_COMMITTER_NAME=Capstan Test", "GIT_COMMITTER_EMAIL=test@capstan.dev")
	tree := runCmd(t, env, "", "git", "rev-parse", "refs/heads/main^{tree}")
	args := append(config, "commit-tree", "-S", "-p", "refs/heads/main", "-m", "signed", tree)
	commit := runCmd(t, env, "", "git", args...)
	runCmd(t, env, "", "git", "update-ref", "refs/heads/main", commit)
	return commit
}

// sshKey makes an ed25519 key pair and returns the private key's path and
// the public key line.
func sshKey(t *testing.T, dir, name string) (string, []byte) {
	t.Helper()
	path := filepath.Join(dir, name)
	runCmd(t, nil, "", "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", path)
	pub, err := os.ReadFile(path + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return path, pub
}

// gpgHome makes a GnuPG home with one signing key for email and returns its
// environment and the armored public key.
func gpgHome(t *testing.T, email string) ([]string, string) {
	t.Helper()
	// gpg-agent's socket path must stay short: no t.TempDir here.
	home, err := os.MkdirTemp("", "gpg")
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"GNUPGHOME=" + home}
	t.Cleanup(func() {
		_ = exec.Command("gpgconf", "--homedir", home, "--kill", "gpg-agent").Run()
		os.RemoveAll(home)
	})
	runCmd(t, env, "", "gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key", "Capstan Test <"+email+">", "ed25519", "sign", "never")
	return env, runCmd(t, env, "", "gpg", "--armor", "--export", email)
}

func TestVerifySignedCommits(t *testing.T) {
	keys := t.TempDir()
	trustedSSH, trustedSSHPub := sshKey(t, keys, "trusted")
	otherSSH, _ := sshKey(t, keys, "other")
	gpgEnv, trustedPGP := gpgHome(t, "trusted@capstan.dev")
	_, otherPGP := gpgHome(t, "other@capstan.dev")

	sshSigned := func(key string) func(t *testing.T, repo string) {
		return func(t *testing.T, repo string) {
			signHead(t, repo, nil, "-c", "gpg.format=ssh", "-c", "user.signingkey="+key)
		}
	}
	tests := []struct {
		name   string
		sign   func(t *testing.T, repo string)
		verify Verify
		want   string // "" for accepted
	}{
		{name: "SSH-signed with a trusted key", sign: sshSigned(trustedSSH), verify: Verify{SSHKeys: [][]byte{trustedSSHPub}}},
		{name: "SSH-signed with another key", sign: sshSigned(otherSSH), verify: Verify{SSHKeys: [][]byte{trustedSSHPub}}, want: "which is not trusted"},
		{name: "OpenPGP-signed with a trusted key", sign: func(t *testing.T, repo string) {
			signHead(t, repo, gpgEnv, "-c", "gpg.program=gpg", "-c", "user.signingkey=trusted@capstan.dev")
		}, verify: Verify{OpenPGPKeyRings: []string{otherPGP, trustedPGP}}},
		{name: "OpenPGP-signed with another key", sign: func(t *testing.T, repo string) {
			signHead(t, repo, gpgEnv, "-c", "gpg.program=gpg", "-c", "user.signingkey=trusted@capstan.dev")
		}, verify: Verify{OpenPGPKeyRings: []string{otherPGP}}, want: "verifies with none of the trusted keys"},
		{name: "OpenPGP-signed, only SSH keys trusted", sign: func(t *testing.T, repo string) {
			signHead(t, repo, gpgEnv, "-c", "gpg.program=gpg", "-c", "user.signingkey=trusted@capstan.dev")
		}, verify: Verify{SSHKeys: [][]byte{trustedSSHPub}}, want: "no OpenPGP key is trusted"},
		{name: "unsigned", sign: func(*testing.T, string) {}, verify: Verify{SSHKeys: [][]byte{trustedSSHPub}}, want: "is not signed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			repo, _ := newRepo(t, map[string]string{"a.yaml": "a"})
			tt.sign(t, repo)
			verify := tt.verify
			s := httpSource(t, repo, func(o *Options) { o.Verify = &verify })
			art, err := s.Fetch(testContext(t))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Fetch = %v, want the signed commit", err)
				}
				if got := readAll(t, art.FS)["a.yaml"]; got != "a" {
					t.Errorf("a.yaml = %q", got)
				}
				return
			}
			if !errors.Is(err, sources.ErrRefused) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Fetch = %v, want ErrRefused containing %q", err, tt.want)
			}
		})
	}

	if _, err := New(Options{URL: server.HTTPURL("x"), Verify: &Verify{}}); !errors.Is(err, sources.ErrInvalid) {
		t.Errorf("New with verification and no key = %v, want ErrInvalid", err)
	}
	if _, err := New(Options{URL: server.HTTPURL("x"), Verify: &Verify{SSHKeys: [][]byte{[]byte("not a key")}}}); !errors.Is(err, sources.ErrInvalid) {
		t.Errorf("New with a bad SSH key = %v, want ErrInvalid", err)
	}
}

// The SSHSIG check itself: a signature made by ssh-keygen -Y sign verifies
// for its message and namespace only.
func TestVerifySSHSig(t *testing.T) {
	dir := t.TempDir()
	key, pub := sshKey(t, dir, "k")
	trusted, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	message := "tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\n\nsigned\n"
	sign := func(namespace string) string {
		return runCmd(t, nil, message, "ssh-keygen", "-q", "-Y", "sign", "-n", namespace, "-f", key)
	}
	sig := sign("git")
	if err := verifySSHSig(sig, []byte(message), []ssh.PublicKey{trusted}); err != nil {
		t.Fatalf("genuine signature: %v", err)
	}
	if err := verifySSHSig(sig, []byte(message+"tampered"), []ssh.PublicKey{trusted}); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("signature of another message = %v, want a mismatch", err)
	}
	if err := verifySSHSig(sign("file"), []byte(message), []ssh.PublicKey{trusted}); err == nil || !strings.Contains(err.Error(), `namespace "file"`) {
		t.Errorf("signature in another namespace = %v, want it refused", err)
	}
}

package git

import (
	"errors"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/sources"
)

func TestNewAcceptsSupportedURLs(t *testing.T) {
	key, knownHosts := testSSHKeys(t, "git.example.com")
	sshAuth := Auth{SSHPrivateKey: key, SSHKnownHosts: knownHosts}
	tests := []struct {
		url         string
		auth        Auth
		wantDisplay string
	}{
		{url: "https://git.example.com/infra.git", wantDisplay: "https://git.example.com/infra.git"},
		{url: "http://127.0.0.1:8080/infra.git", wantDisplay: "http://127.0.0.1:8080/infra.git"},
		{url: "https://alice@git.example.com/infra.git", wantDisplay: "https://git.example.com/infra.git"},
		{url: "git://git.example.com/infra.git", wantDisplay: "git://git.example.com/infra.git"},
		{url: "file:///srv/git/infra.git", wantDisplay: "file:///srv/git/infra.git"},
		{url: "ssh://git@git.example.com/infra.git", auth: sshAuth, wantDisplay: "ssh://git.example.com/infra.git"},
		{url: "git@git.example.com:org/infra.git", auth: sshAuth, wantDisplay: "git@git.example.com:org/infra.git"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			s, err := New(Options{URL: tt.url, Auth: tt.auth})
			if err != nil {
				t.Fatal(err)
			}
			if s.URL() != tt.wantDisplay || s.Branch() != DefaultBranch {
				t.Errorf("URL, Branch = %q, %q; want %q, %q", s.URL(), s.Branch(), tt.wantDisplay, DefaultBranch)
			}
		})
	}
}

func TestNewRefusesBadSettings(t *testing.T) {
	key, knownHosts := testSSHKeys(t, "git.example.com")
	tests := []struct {
		name   string
		opts   Options
		want   string
		secret string
	}{
		{name: "an empty URL", opts: Options{}, want: "URL is empty"},
		{name: "an unsupported scheme", opts: Options{URL: "ftp://git.example.com/infra.git"}, want: `unsupported scheme "ftp"`},
		{name: "a bare local path", opts: Options{URL: "/srv/git/infra.git"}, want: "write file:///srv/git/infra.git"},
		{name: "a URL without host", opts: Options{URL: "https:///infra.git"}, want: "no host"},
		{name: "a password in the URL", opts: Options{URL: "https://alice:hunter2-pass@git.example.com/infra.git"},
			want: "put credentials in spec.source.git.secretRef", secret: "hunter2-pass"},
		{name: "a password in an unparsable URL", opts: Options{URL: "https://alice:hunter2-pass@git.example.com:port/x"},
			want: "does not parse", secret: "hunter2-pass"},
		{name: "a password in an scp-like URL", opts: Options{URL: "alice:hunter2-pass@git.example.com:infra.git"},
			want: "holds a password", secret: "hunter2-pass"},
		{name: "a ref instead of a branch", opts: Options{URL: "https://git.example.com/x", Branch: "refs/heads/main"},
			want: "plain branch name"},
		{name: "ssh without a key", opts: Options{URL: "ssh://git@git.example.com/x", Auth: Auth{SSHKnownHosts: knownHosts}},
			want: "needs a private key"},
		{name: "ssh without known_hosts", opts: Options{URL: "ssh://git@git.example.com/x", Auth: Auth{SSHPrivateKey: key}},
			want: "needs the server's host key"},
		{name: "ssh with known_hosts for another host", opts: Options{URL: "ssh://git@git.other.com/x",
			Auth: Auth{SSHPrivateKey: key, SSHKnownHosts: knownHosts}}, want: "known_hosts has no key for git.other.com"},
		{name: "ssh with a garbled key", opts: Options{URL: "ssh://git@git.example.com/x",
			Auth: Auth{SSHPrivateKey: []byte("not a key"), SSHKnownHosts: knownHosts}}, want: "parse ssh private key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.opts)
			if !errors.Is(err, sources.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, want sources.ErrInvalid saying %q", err, tt.want)
			}
			if tt.secret != "" && strings.Contains(err.Error(), tt.secret) {
				t.Errorf("error %q shows the password", err)
			}
		})
	}
}

package git

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/trickle"
)

// The caller's deadline cuts a server that trickles its answer a byte a
// second, in a revision check and in a fetch alike: the deadline is what
// bounds them, not the server's pace.
func TestDeadlineCutsATricklingServer(t *testing.T) {
	repo, _ := newRepo(t, map[string]string{"a.yaml": "a: 1\n"})
	slow := trickle.Start(server.URL(), trickle.Options{Interval: time.Second})
	t.Cleanup(slow.Close)
	src, err := New(Options{URL: slow.URL + "/" + repo + ".git", Auth: Auth{Username: testUser, Password: testPassword}})
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]func(context.Context) error{
		"revision check": func(ctx context.Context) error { _, err := src.Revision(ctx); return err },
		"fetch":          func(ctx context.Context) error { _, err := src.Fetch(ctx); return err },
	}
	for name, op := range ops {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- op(ctx) }()
			select {
			case err := <-done:
				if err == nil {
					t.Errorf("%s of a trickling server succeeded within its deadline; the server was meant to be too slow", name)
				}
				if err != nil && strings.Contains(err.Error(), testPassword) {
					t.Errorf("the error holds the password: %v", err)
				}
			case <-time.After(time.Minute):
				t.Fatalf("%s of a trickling server still runs a minute after its deadline", name)
			}
		})
	}
}

// Every http(s) exchange of go-git in the process goes through a
// transport with deadlines for the steps a server could stall in.
func TestGitHTTPTransportHasDeadlines(t *testing.T) {
	tr := newHTTPTransport()
	if tr.TLSHandshakeTimeout <= 0 || tr.ResponseHeaderTimeout <= 0 || tr.DialContext == nil || tr.IdleConnTimeout <= 0 {
		t.Errorf("transport deadlines: TLS handshake %s, response header %s, idle %s, dialer set %v; want all set",
			tr.TLSHandshakeTimeout, tr.ResponseHeaderTimeout, tr.IdleConnTimeout, tr.DialContext != nil)
	}
}

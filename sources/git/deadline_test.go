package git

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// trickleServer forwards every request to upstream and sends the answer
// back one byte per interval: a server that answers, slowly enough to
// hold a client that only waits for the next byte forever.
func trickleServer(t *testing.T, upstream string, interval time.Duration) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, err := http.NewRequestWithContext(r.Context(), r.Method, upstream+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header = r.Header.Clone()
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		answer, _ := io.ReadAll(res.Body)
		res.Body.Close()
		for k, v := range res.Header {
			if k != "Content-Length" {
				w.Header()[k] = v
			}
		}
		w.WriteHeader(res.StatusCode)
		for i := range answer {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(interval):
			}
			if _, err := w.Write(answer[i : i+1]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv
}

// The caller's deadline cuts a server that trickles its answer a byte a
// second, in a revision check and in a fetch alike: the deadline is what
// bounds them, not the server's pace.
func TestDeadlineCutsATricklingServer(t *testing.T) {
	repo, _ := newRepo(t, map[string]string{"a.yaml": "a: 1\n"})
	slow := trickleServer(t, server.URL(), time.Second)
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

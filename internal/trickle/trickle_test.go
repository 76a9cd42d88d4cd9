package trickle

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func upstream(t *testing.T, answer string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Upstream", r.URL.Path)
		_, _ = io.WriteString(w, answer)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func get(ctx context.Context, url string) (*http.Response, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, "", err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	return res, string(body), err
}

// The proxy forwards the path and brings the whole answer back, trickled
// or passed whole, with the upstream's headers.
func TestProxyForwards(t *testing.T) {
	up := upstream(t, "hello")
	p := Start(up.URL, Options{Interval: time.Millisecond, Slow: func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/slow") }})
	t.Cleanup(p.Close)
	for _, path := range []string{"/slow/x", "/fast/y"} {
		res, body, err := get(t.Context(), p.URL+path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		if body != "hello" || res.Header.Get("X-Upstream") != path {
			t.Errorf("GET %s: body %q, X-Upstream %q; want hello and the path", path, body, res.Header.Get("X-Upstream"))
		}
		if wantLength := path == "/fast/y"; (res.ContentLength == 5) != wantLength {
			t.Errorf("GET %s: content length %d; a whole answer keeps it, a trickled one goes chunked", path, res.ContentLength)
		}
	}
}

// A caller's deadline cuts a trickled answer, and the proxy counts the
// request while it holds it.
func TestDeadlineCutsTrickle(t *testing.T) {
	up := upstream(t, strings.Repeat("x", 1000))
	p := Start(up.URL, Options{})
	t.Cleanup(p.Close)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { _, _, err := get(ctx, p.URL+"/"); done <- err }()
	for p.InFlight() == 0 {
		select {
		case err := <-done:
			t.Fatalf("the request ended before the proxy held it: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("a cancelled read of a trickle returned %v; want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a cancelled read of a trickle still runs a minute later")
	}
}

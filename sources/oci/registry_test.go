package oci

import (
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
)

// testRegistry is go-containerregistry's registry (a real implementation
// of the distribution API, in memory) served over HTTP on 127.0.0.1, with
// every request recorded so that tests can count what a poll costs.
type testRegistry struct {
	srv  *httptest.Server
	Host string // 127.0.0.1:port

	mu       sync.Mutex
	requests []string // "HEAD manifests", "GET blobs", ...
}

// newTestRegistry starts a registry for one test. With user set, every
// request needs HTTP basic auth with user and password, as a registry
// behind htpasswd does.
func newTestRegistry(t testing.TB, user, password string) *testRegistry {
	t.Helper()
	return startRegistry(t, user, password, nil)
}

// newTLSRegistry starts a registry for one test that speaks https with
// cfg (a certificate of a private CA), anonymous.
func newTLSRegistry(t testing.TB, cfg *tls.Config) *testRegistry {
	t.Helper()
	return startRegistry(t, "", "", cfg)
}

func startRegistry(t testing.TB, user, password string, cfg *tls.Config) *testRegistry {
	t.Helper()
	r := &testRegistry{}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	handler := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.record(req)
		if user != "" {
			u, p, ok := req.BasicAuth()
			if !ok || u != user || p != password {
				w.Header().Set("WWW-Authenticate", `Basic realm="capstan-test"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
				return
			}
		}
		inner.ServeHTTP(w, req)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.srv = httptest.NewUnstartedServer(handler)
	r.srv.Listener.Close()
	r.srv.Listener = ln
	if cfg != nil {
		// Clients refused by a test log handshake errors; they are expected.
		r.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		r.srv.TLS = cfg
		r.srv.StartTLS()
	} else {
		r.srv.Start()
	}
	t.Cleanup(r.srv.Close)
	r.Host = ln.Addr().String()
	return r
}

// URL returns the oci:// URL of repo on this registry.
func (r *testRegistry) URL(repo string) string { return "oci://" + r.Host + "/" + repo }

func (r *testRegistry) record(req *http.Request) {
	kind := "other"
	switch p := req.URL.Path; {
	case p == "/v2/" || p == "/v2":
		kind = "ping"
	case strings.Contains(p, "/manifests/"):
		kind = "manifests"
	case strings.Contains(p, "/blobs/"):
		kind = "blobs"
	case strings.HasSuffix(p, "/tags/list"):
		kind = "tags"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests = append(r.requests, req.Method+" "+kind)
}

// take returns the requests recorded since the last take and forgets them.
func (r *testRegistry) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.requests
	r.requests = nil
	return out
}

// count returns how many of reqs are want ("GET blobs").
func count(reqs []string, want string) int {
	n := 0
	for _, r := range reqs {
		if r == want {
			n++
		}
	}
	return n
}

func sameRequests(got, want []string) bool {
	return slices.Equal(got, want)
}

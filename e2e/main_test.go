package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/testenv"
)

var (
	env    *testenv.Env
	gitSrv *gitserver.Server
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getenv("CAPSTAN_E2E_LOG") != "" {
		ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, nil)))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	begin := time.Now()
	var err error
	// The real Cluster API, Metal3 and IPAM CRDs of the pinned versions,
	// for the capm3 and lcm suites; kube-controller-manager for PDB status,
	// garbage collection and namespace deletion.
	providers, err := testenv.ProviderCRDDirs(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "provider CRDs:", err)
		return 1
	}
	env, err = testenv.Start(ctx, testenv.Options{
		CRDDirs:           append([]string{"../manifests/crds", "testdata/crds"}, providers...),
		ControllerManager: true,
		Progress:          os.Stderr,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start control plane:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: control plane ready in %s\n", time.Since(begin).Round(time.Millisecond))
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop control plane:", err)
		}
	}()
	gitSrv, err = gitserver.New("", gitserver.Options{Username: "capstan", Password: "s3cret-token"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start git server:", err)
		return 1
	}
	defer gitSrv.Close()
	defer stopGitea() // if a test started it (pullrequest_test.go)
	defer func() {
		if built.dir != "" {
			os.RemoveAll(built.dir)
		}
	}()
	return m.Run()
}

// requestCounter counts the API writes a client makes, by method and path:
// "PATCH /api/v1/namespaces/x/configmaps/y", with server-side dry-runs
// counted apart as "PATCH(dry-run) ...".
type requestCounter struct {
	mu       sync.Mutex
	requests int            // every request, reads included
	writes   map[string]int // "PATCH /api/v1/namespaces/x/configmaps/y" -> count
	lists    map[string]int // "/api/v1/namespaces/x/configmaps" -> LISTs (watches not counted)
}

// listsOf counts the LIST requests (not watches) to a path ending in suffix.
func (c *requestCounter) listsOf(suffix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for path, v := range c.lists {
		if strings.HasSuffix(path, suffix) {
			n += v
		}
	}
	return n
}

// all returns how many requests were made, reads included.
func (c *requestCounter) all() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests
}

// wrap returns a copy of cfg whose requests are counted.
func (c *requestCounter) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			c.mu.Lock()
			c.requests++
			if q := req.URL.Query(); req.Method == http.MethodGet && q.Get("watch") != "true" && q.Get("watch") != "1" {
				if c.lists == nil {
					c.lists = map[string]int{}
				}
				c.lists[req.URL.Path]++
			}
			c.mu.Unlock()
			if req.Method != http.MethodGet {
				c.mu.Lock()
				if c.writes == nil {
					c.writes = map[string]int{}
				}
				method := req.Method
				if req.URL.Query().Has("dryRun") {
					method += "(dry-run)"
				}
				c.writes[method+" "+req.URL.Path]++
				c.mu.Unlock()
			}
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

// total counts writes whose "METHOD path" contains every one of parts.
func (c *requestCounter) total(parts ...string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
outer:
	for k, v := range c.writes {
		for _, p := range parts {
			if !strings.Contains(k, p) {
				continue outer
			}
		}
		n += v
	}
	return n
}

func (c *requestCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.writes))
	for k, v := range c.writes {
		out[k] = v
	}
	return out
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

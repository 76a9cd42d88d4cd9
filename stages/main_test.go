package stages_test

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// env is the control plane shared by the executor tests, with the CRDs of
// testdata/crds installed. It is nil under -short, where only the tests
// that need no cluster run.
var env *testenv.Env

func TestMain(m *testing.M) {
	flag.Parse()
	// The executor logs nothing itself; this silences controller-runtime's
	// complaint that no logger was set.
	ctrllog.SetLogger(logr.Discard())
	if testing.Short() {
		os.Exit(m.Run())
	}
	// Generous because a first run may build the binaries.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	var err error
	env, err = testenv.Start(ctx, testenv.Options{CRDDirs: []string{"testdata/crds"}, Progress: os.Stderr})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start test control plane:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop test control plane:", err)
		code = 1
	}
	os.Exit(code)
}

// testContext bounds a test: nothing in these tests should take a minute.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newNamespace creates the test's own namespace, or skips the test when
// there is no control plane (-short).
func newNamespace(t testing.TB) string {
	t.Helper()
	if env == nil {
		t.Skip("needs the test control plane; not started under -short")
	}
	ns, err := env.CreateNamespace(testContext(t), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// newClient returns a client of the test control plane whose requests are
// recorded.
func newClient(t testing.TB) (client.WithWatch, *requestLog) {
	t.Helper()
	log := &requestLog{changed: make(chan struct{})}
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			log.record(req)
			return rt.RoundTrip(req)
		})
	}
	c, err := client.NewWithWatch(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c, log
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// request is what requestLog keeps of one request.
type request struct {
	method, path string
	dryRun       bool
	watch        bool
}

func (r request) String() string {
	s := r.method + " " + r.path
	if r.dryRun {
		s += " (dry run)"
	}
	return s
}

// write reports whether the request may change the cluster, dry runs
// included: an executor that should not write should not even ask.
func (r request) write() bool {
	switch r.method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// requestLog records the requests a client sends and lets a test wait for
// one.
type requestLog struct {
	mu       sync.Mutex
	requests []request
	changed  chan struct{} // closed and replaced on every request
}

func (l *requestLog) record(req *http.Request) {
	q := req.URL.Query()
	r := request{
		method: req.Method,
		path:   req.URL.Path,
		dryRun: q.Get("dryRun") != "",
		watch:  q.Get("watch") == "true" || q.Get("watch") == "1",
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests = append(l.requests, r)
	close(l.changed)
	l.changed = make(chan struct{})
}

// mark returns a position in the log; since lists what came after it.
func (l *requestLog) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.requests)
}

func (l *requestLog) since(mark int) []request {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]request(nil), l.requests[mark:]...)
}

// writesSince lists the requests after mark that may change the cluster;
// dry runs are left out unless withDryRun.
func (l *requestLog) writesSince(mark int, withDryRun bool) []string {
	var writes []string
	for _, r := range l.since(mark) {
		if r.write() && (withDryRun || !r.dryRun) {
			writes = append(writes, r.String())
		}
	}
	return writes
}

// waitForWatch blocks until a watch request whose path ends with suffix
// was sent after mark, or ctx ends.
func (l *requestLog) waitForWatch(ctx context.Context, mark int, suffix string) error {
	for {
		l.mu.Lock()
		for _, r := range l.requests[mark:] {
			if r.watch && strings.HasSuffix(r.path, suffix) {
				l.mu.Unlock()
				return nil
			}
		}
		changed := l.changed
		l.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("no watch on %s: %w", suffix, ctx.Err())
		}
	}
}

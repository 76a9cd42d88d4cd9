package reconciler_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/capstan-dev/capstan/reconciler"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func get(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), nil
}

// A daemon that cannot reach its API server is alive but not ready: its
// caches never sync, and a readiness probe must keep traffic and rollouts
// away from it. (The e2e suite checks that a daemon with a working API
// server turns ready.)
func TestReadyzFailsWhileCachesHaveNotSynced(t *testing.T) {
	// Nothing listens there: every request of the daemon is refused.
	dead := freeAddr(t)
	health := freeAddr(t)
	opts := reconciler.DefaultOptions()
	opts.Config = &rest.Config{Host: "http://" + dead}
	opts.MetricsAddr, opts.HealthAddr = "0", health
	opts.MetricsRegistry = prometheus.NewRegistry()
	opts.LeaderElection.Enabled = false
	d, err := reconciler.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
		<-done
	})

	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _, err := get("http://" + health + "/healthz")
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz did not answer 200 within 30s: code %d, %v", code, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	code, body, err := get("http://" + health + "/readyz?verbose")
	if err != nil {
		t.Fatal(err)
	}
	if code == http.StatusOK {
		t.Fatalf("/readyz = 200 while the API server is unreachable: %s", body)
	}
	t.Logf("/readyz: %d %s", code, body)
	if !strings.Contains(body, "informers-synced") {
		t.Errorf("/readyz body does not name the failing check: %s", body)
	}
}

package reconciler_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
)

// A daemon whose API server goes away is not ready until it is back: its
// informers stay synced through the outage, so /readyz asks the API
// server itself. The control plane is this test's own, since it stops it.
func TestReadyzFollowsTheAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	env, err := testenv.Start(ctx, testenv.Options{CRDDirs: []string{"../manifests/crds"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	health := freeAddr(t)
	opts := reconciler.DefaultOptions()
	opts.Config = env.Config
	opts.MetricsAddr, opts.HealthAddr = "0", health
	opts.MetricsRegistry = prometheus.NewRegistry()
	opts.LeaderElection.Enabled = false
	d, err := reconciler.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
		<-done
	})

	readyz := "http://" + health + "/readyz?verbose"
	waitReadyz(t, readyz, "ready with its API server up", func(code int, _ string) bool { return code == http.StatusOK })

	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	body := waitReadyz(t, readyz, "not ready while the API server is down", func(code int, _ string) bool { return code != http.StatusOK })
	if !strings.Contains(body, "api-server") {
		t.Errorf("/readyz does not name the failing check: %s", body)
	}
	t.Logf("/readyz while the API server is down: %s", body)

	if err := env.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	waitReadyz(t, readyz, "ready again once the API server is back", func(code int, _ string) bool { return code == http.StatusOK })
}

// waitReadyz polls url until ok holds for its answer, or fails the test
// after a minute; it returns the last body.
func waitReadyz(t *testing.T, url, what string, ok func(code int, body string) bool) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var (
		code int
		body string
		err  error
	)
	for time.Now().Before(deadline) {
		if code, body, err = get(url); err == nil && ok(code, body) {
			return body
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("/readyz: timed out waiting to be %s: last answer %d %q (%v)", what, code, body, err)
	return ""
}

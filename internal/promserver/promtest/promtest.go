// Package promtest runs a real Prometheus for end-to-end tests: it scrapes
// a Capstan daemon's /metrics and evaluates the alert rules Capstan ships,
// so a test can wait for an alert to fire and query the series it fired
// on. Tests that need it share it here instead of each carrying a copy.
package promtest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/promserver"
)

// Tools returns promtool and prometheus, installing Debian's package when
// they are missing. Where that is impossible the test is skipped, except
// on CI (CI=true), where it fails.
func Tools(t testing.TB) promserver.Binaries {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	b, err := promserver.EnsureInstalled(ctx, os.Stderr)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return b
}

// FreeAddr is a 127.0.0.1 address nothing listened on a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := promserver.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// Start runs a real prometheus that scrapes target as job "capstan" every
// second and evaluates the rules file at rulesPath every second, with the
// `for` of the alerts in forOverride shortened. It stops when the test
// ends, printing its log if the test failed.
func Start(t testing.TB, binary, rulesPath, target string, forOverride map[string]time.Duration) *promserver.Server {
	t.Helper()
	shipped, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := promserver.OverrideFor(shipped, forOverride)
	if err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [capstan.rules.yaml]
scrape_configs:
  - job_name: capstan
    honor_labels: true
    static_configs:
      - targets: [%q]
`, target)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	prom, err := promserver.Start(ctx, promserver.Options{
		Binary: binary, Config: config, Files: map[string][]byte{"capstan.rules.yaml": rules},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("prometheus log:\n%s", prom.Log())
		}
		if err := prom.Close(); err != nil {
			t.Errorf("stop prometheus: %v", err)
		}
	})
	return prom
}

// AlertState returns the state of the active alert whose labels include
// want ("pending" or "firing"), or "" when no such alert is active.
func AlertState(t testing.TB, prom *promserver.Server, want map[string]string) (string, error) {
	t.Helper()
	alerts, err := prom.Alerts(t.Context())
	if err != nil {
		return "", err
	}
next:
	for _, a := range alerts {
		for k, v := range want {
			if a.Labels[k] != v {
				continue next
			}
		}
		return a.State, nil
	}
	return "", nil
}

// QueryValue returns the value of the one series expr selects.
func QueryValue(t testing.TB, prom *promserver.Server, expr string) (string, error) {
	t.Helper()
	samples, err := prom.Query(t.Context(), expr)
	if err != nil {
		return "", err
	}
	if len(samples) != 1 {
		return "", fmt.Errorf("%s: %d series, want 1: %v", expr, len(samples), samples)
	}
	return samples[0].Value, nil
}

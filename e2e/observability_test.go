package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/promserver/promtest"
	"github.com/capstan-dev/capstan/reconciler"
)

// shippedRules is the plain rules file Capstan ships.
const shippedRules = "../manifests/alerts/capstan.rules.yaml"

func httpGet(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// A stage that waits past its stuckAfter makes the shipped
// CapstanStageStuck alert go pending, then firing, in a real Prometheus
// scraping the real daemon; the stage turning Ready resolves it. Waiting
// counts as no failure, a deleted deployment leaves no series, and a
// daemon that is gone fires CapstanMetricsMissing.
func TestStuckStageAlertFiresAndResolves(t *testing.T) {
	bins := promtest.Tools(t)
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("1"), "two-stage overlay"); err != nil {
		t.Fatal(err)
	}
	metricsAddr, healthAddr := promtest.FreeAddr(t), promtest.FreeAddr(t)
	d, _ := startDaemonWith(t, nil, func(o *reconciler.Options) {
		o.MetricsAddr, o.HealthAddr = metricsAddr, healthAddr
	})
	waitFor(t, "the daemon's /readyz to answer 200", func() (bool, error) {
		code, body, err := httpGet("http://" + healthAddr + "/readyz")
		return code == http.StatusOK, fmt.Errorf("%d %s %v", code, body, err)
	})
	if code, body, err := httpGet("http://" + healthAddr + "/healthz"); err != nil || code != http.StatusOK {
		t.Fatalf("/healthz = %d %q, %v; want 200", code, body, err)
	}

	prom := promtest.Start(t, bins.Prometheus, shippedRules, metricsAddr, map[string]time.Duration{
		"CapstanStageStuck":     3 * time.Second,
		"CapstanMetricsMissing": 2 * time.Second,
	})
	spec := twoStageSpec(url, ns, gitSecret(t, c, ns))
	spec.Stages[0].StuckAfter = &metav1.Duration{Duration: 2 * time.Second}
	createDeployment(t, c, ns, "stuck", spec)

	stuck := map[string]string{"alertname": "CapstanStageStuck", "namespace": ns, "cluster": "stuck", "stage": "Infra"}
	var seen []string
	waitFor(t, "CapstanStageStuck to fire", func() (bool, error) {
		state, err := promtest.AlertState(t, prom, stuck)
		if state != "" && (len(seen) == 0 || seen[len(seen)-1] != state) {
			seen = append(seen, state)
		}
		return state == "firing", err
	})
	if seen[0] != "pending" {
		t.Errorf("CapstanStageStuck went through %v, want pending before firing", seen)
	}
	cd := getDeployment(t, c, ns, "stuck")
	if st := stage(cd, "Infra"); st.State != capstanv1.StageInProgress || !st.Stuck {
		t.Errorf("alert firing but stage Infra is %s stuck=%t: %s", st.State, st.Stuck, describe(cd))
	}
	sel := fmt.Sprintf(`namespace=%q, cluster="stuck"`, ns)
	for expr, want := range map[string]string{
		// Waiting for the Widget is not a failure.
		"capstan_reconcile_consecutive_failures{" + sel + "}":                      "0",
		"capstan_stage_state{" + sel + `, stage="Infra", state="InProgress"}`:      "1",
		"capstan_stage_state{" + sel + `, stage="App", state="Pending"}`:           "1",
		`capstan_source_revision_info{` + sel + `, revision=~"main@sha1:.+"}`:      "1",
		"capstan_apply_objects_total{" + sel + `, action="created"}`:               "2",
		"time() - capstan_source_last_success_timestamp_seconds{" + sel + "} < 60": "",
	} {
		got, err := promtest.QueryValue(t, prom, expr)
		if err != nil {
			t.Errorf("query: %v", err)
		} else if want != "" && got != want {
			t.Errorf("%s = %s, want %s", expr, got, want)
		}
	}

	// The widget controller marks it ready: the stage is done, the alert
	// resolves.
	setWidgetReady(t, c, ns, "infra")
	waitDeployment(t, c, ns, "stuck", "Ready", isReady)
	waitFor(t, "CapstanStageStuck to resolve", func() (bool, error) {
		state, err := promtest.AlertState(t, prom, stuck)
		return state == "" && err == nil, fmt.Errorf("state %q, %v", state, err)
	})
	if v, err := promtest.QueryValue(t, prom, "capstan_stage_stuck{"+sel+`, stage="Infra"}`); err != nil || v != "0" {
		t.Errorf("stage_stuck of the Ready stage = %s, %v; want 0", v, err)
	}

	// A deleted deployment leaves no series on the daemon's endpoint.
	if err := c.Delete(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted deployment's series to go", func() (bool, error) {
		series, err := scrapeSeries("http://"+metricsAddr+"/metrics", fmt.Sprintf(`namespace=%q`, ns))
		return len(series) == 0 && err == nil, fmt.Errorf("%d series left: %v (%v)", len(series), series, err)
	})

	// The daemon is gone: nothing is scraped, CapstanMetricsMissing fires.
	missing := map[string]string{"alertname": "CapstanMetricsMissing"}
	if state, err := promtest.AlertState(t, prom, missing); err != nil || state != "" {
		t.Fatalf("CapstanMetricsMissing is %q (%v) while the daemon is scraped", state, err)
	}
	stopDaemon(d)
	waitFor(t, "CapstanMetricsMissing to fire", func() (bool, error) {
		state, err := promtest.AlertState(t, prom, missing)
		return state == "firing", err
	})
}

// scrapeSeries returns the lines of a metrics endpoint that contain every
// one of parts.
func scrapeSeries(url string, parts ...string) ([]string, error) {
	code, body, err := httpGet(url)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d", url, code)
	}
	var out []string
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out, sc.Err()
}

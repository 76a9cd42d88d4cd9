package scale

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFleetIsReadyAndIdle holds a small fleet to the behaviour the 1,000
// benchmark measures, as counts: every deployment becomes Ready within a
// budget of API requests per object and per deployment, and once
// they are, an unchanged source costs the API server no request over
// three poll intervals, and the git server fewer requests than one per
// deployment and interval. A daemon started on the Ready fleet looks at
// every object once (a dry run each, nothing applied) and is idle again.
func TestFleetIsReadyAndIdle(t *testing.T) {
	f := fleet{deployments: 50, objects: 20, interval: 5 * time.Second, idle: 3, deadline: 3 * time.Minute, restart: true}
	r := runFleet(t, f)
	if r.ready < f.deployments {
		t.Fatalf("%d of %d deployments Ready", r.ready, f.deployments)
	}
	logResult(t, f, r)
	// To Ready, a deployment costs the API server a dry run and an apply
	// per object and a few requests of its own: its finalizer, two status
	// writes (the walk's start and its end), one event, the claim of its
	// fencing record (5; 2026-11-28: 45.0 per deployment of 20 objects,
	// 68.4 before the apply trusted the preflight's "absent", status and
	// events were merged and the namespace remembered). One request per
	// deployment spare for a conflict retried under load. Issue 29's
	// target is 4.
	if budget := int64(f.deployments * (2*f.objects + 6)); r.toReadyRequests > budget {
		t.Errorf("the fleet sent %d API requests to Ready (%.1f per deployment), want at most %d (%d per deployment): %s",
			r.toReadyRequests, float64(r.toReadyRequests)/float64(f.deployments), budget, 2*f.objects+6, perDeployment(byKind(r.toReadyBy), f.deployments))
	}
	if r.apiRequests != 0 {
		t.Errorf("an idle fleet sent %d API requests over %d intervals: %s", r.apiRequests, f.idle, topPaths(r.apiByPath, 8))
	}
	// The deployments read one repository: they share its answers
	// instead of asking it once each per interval.
	if polls := int64(f.deployments * f.idle); r.gitRequests >= polls {
		t.Errorf("an idle fleet of %d deployments on one repository sent %d git requests over %d intervals; want fewer than one per deployment and interval",
			f.deployments, r.gitRequests, f.idle)
	}
	if rr := r.restart; rr.applies != 0 || rr.idle != 0 {
		t.Errorf("the daemon started on the Ready, unchanged fleet applied %d ConfigMaps in its look and sent %d API requests over %d idle intervals after it (%s); want 0 and 0",
			rr.applies, rr.idle, f.idle, topPaths(rr.idleBy, 8))
	}
}

// BenchmarkThousandDeployments is issue #13's fleet: 1,000
// ClusterDeployments of 20 ConfigMaps each, one overlay directory each in
// one git repository, polled every 30 s by one `capstan run`. Targets:
// all Ready, peak RSS under 300 MiB, idle CPU under 2% of one core, no API
// request per interval when nothing changed. Run it alone:
//
//	go test -run '^$' -bench ThousandDeployments -benchtime 1x -timeout 60m ./e2e/scale/
func BenchmarkThousandDeployments(b *testing.B) {
	f := fleet{deployments: 1000, objects: 20, interval: 30 * time.Second, idle: 3, deadline: 30 * time.Minute, restart: true, limits: true}
	for range b.N {
		r := runFleet(b, f)
		if r.ready < f.deployments {
			b.Fatalf("%d of %d deployments Ready", r.ready, f.deployments)
		}
		logResult(b, f, r)
		reportAgainstLimits(b, f, r)
		b.ReportMetric(r.toReady.Seconds(), "s-to-ready")
		b.ReportMetric(float64(r.mem.peak>>20), "peak-MiB")
		b.ReportMetric(100*r.idleCPU(), "idle-cpu-%")
		b.ReportMetric(r.perInterval(r.apiRequests, f), "api-req/interval")
		b.ReportMetric(r.perInterval(r.gitRequests, f), "git-req/interval")
		b.ReportMetric(r.restart.toLooked.Seconds(), "s-restart-look")
		b.ReportMetric(float64(r.restart.peak>>20), "restart-peak-MiB")
		b.ReportMetric(float64(r.restart.idle)/float64(f.idle), "restart-api-req/interval")
	}
}

// BenchmarkFleetCurve is the fleet at several sizes, each beside the
// limits of its own objects (issue 29: the growth must be linear):
//
//	CAPSTAN_FLEET_SIZES=100,1000,3000 go test -run '^$' -bench FleetCurve -benchtime 1x -timeout 120m ./e2e/scale/
func BenchmarkFleetCurve(b *testing.B) {
	sizes := os.Getenv("CAPSTAN_FLEET_SIZES")
	if sizes == "" {
		sizes = "100,1000,3000"
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			b.Fatalf("CAPSTAN_FLEET_SIZES: %q is not a positive number", s)
		}
		b.Run(fmt.Sprintf("deployments=%d", n), func(b *testing.B) {
			f := fleet{deployments: n, objects: 20, interval: 30 * time.Second, idle: 1, deadline: 60 * time.Minute, limits: true}
			for range b.N {
				r := runFleet(b, f)
				if r.ready < f.deployments {
					b.Fatalf("%d of %d deployments Ready", r.ready, f.deployments)
				}
				logResult(b, f, r)
				reportAgainstLimits(b, f, r)
			}
		})
	}
}

// reportAgainstLimits reports a fleet run's time to all Ready against the
// limits measured in the same run, and its requests per deployment.
func reportAgainstLimits(b *testing.B, f fleet, r fleetResult) {
	b.Helper()
	b.ReportMetric(r.toReady.Seconds(), "s-to-ready")
	b.ReportMetric(r.limits.plain.Seconds(), "s-plain-limit")
	b.ReportMetric(r.limits.validated.Seconds(), "s-validated-limit")
	if r.limits.validated > 0 {
		b.ReportMetric(float64(r.toReady)/float64(r.limits.validated), "x-validated")
		b.ReportMetric(float64(r.toReady)/float64(r.limits.plain), "x-plain")
	}
	b.ReportMetric(float64(r.toReadyRequests)/float64(f.deployments), "req/deployment")
	b.ReportMetric(float64(r.mem.peak>>20), "peak-MiB")
	b.ReportMetric(100*r.idleCPU(), "idle-cpu-%")
}

package scale

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
)

// fleet describes one run: how many deployments, how many objects each,
// how often they poll, and how many poll intervals the idle measurement
// lasts.
type fleet struct {
	deployments int
	objects     int
	interval    time.Duration
	idle        int // intervals measured once all are Ready
	// deadline bounds the wait for all Ready.
	deadline time.Duration
	// restart stops the daemon after the idle window and starts another
	// on the Ready fleet: its look at what it did not walk itself (a dry
	// run of every object), then f.idle more intervals.
	restart bool
	// limits measures the plain and validated limits of the fleet's
	// objects first, in the same run (measureLimits).
	limits bool
}

// fleetResult is what a run measured.
type fleetResult struct {
	ready   int           // deployments Ready at the end of the wait
	toReady time.Duration // from the first create to all Ready
	// mem is the daemon's memory at the end of the idle window; its peak
	// is over the whole run.
	mem memory
	// Over the idle window: the daemon's CPU time, requests it sent to
	// the API server (watch starts apart) and to the git server, and
	// rest_client_requests_total's growth (watch starts included).
	window           time.Duration
	cpu              time.Duration
	apiRequests      int64
	apiByPath        map[string]int64
	watches          int64
	restClient       float64
	gitRequests      int64
	reconciles       float64 // controller_runtime_reconcile_total's growth
	goroutines       float64
	heapInUse        float64
	totalAPIRequests int64 // non-watch requests from start to the end of the idle window
	// toReadyRequests are the non-watch requests from the daemon's start
	// to all Ready, toReadyBy the same by "VERB resource" (requestKind).
	toReadyRequests int64
	toReadyBy       map[string]int64

	// restart is what a second daemon, started on the Ready fleet, did
	// (fleet.restart): its look at every object, then idle intervals.
	restart *restartResult
	// limits are the API server's own, when fleet.limits.
	limits limits
}

// restartResult is what the daemon started on a Ready fleet measured.
type restartResult struct {
	toLooked time.Duration // from its start to a dry run of every object
	dryRuns  int64         // dry runs over the look
	applies  int64         // applies over the look (nothing changed: 0)
	requests int64         // requests over the look, watch starts apart
	peak     int64         // its peak RSS over the look, bytes
	idle     int64         // API requests over f.idle intervals after the look
	idleBy   map[string]int64
}

func (r fleetResult) idleCPU() float64 { return float64(r.cpu) / float64(r.window) }

func (r fleetResult) perInterval(n int64, f fleet) float64 { return float64(n) / float64(f.idle) }

// overlayFiles returns the repository of the fleet: one overlay directory
// per deployment, fleet/d0000 ..., each with its own ConfigMaps, so that no
// two deployments declare one object.
func overlayFiles(f fleet, ns string) []gitserver.File {
	files := make([]gitserver.File, 0, 2*f.deployments)
	for i := range f.deployments {
		name := deploymentName(i)
		var b strings.Builder
		for j := range f.objects {
			fmt.Fprintf(&b, "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s-cm-%02d\ndata:\n  deployment: %s\n  index: \"%d\"\n  setting: value-%d-%d\n",
				name, j, name, j, i, j)
		}
		files = append(files,
			gitserver.File{Path: "fleet/" + name + "/kustomization.yaml", Content: "namespace: " + ns + "\nresources: [configmaps.yaml]\n"},
			gitserver.File{Path: "fleet/" + name + "/configmaps.yaml", Content: b.String()})
	}
	return files
}

func deploymentName(i int) string { return fmt.Sprintf("d%04d", i) }

// runFleet pushes the fleet's repository, starts `capstan run` as its own
// process, creates the deployments, waits until all are Ready, lets one
// poll interval pass, and measures the daemon over f.idle intervals in
// which nothing changes.
func runFleet(t testing.TB, f fleet) fleetResult {
	t.Helper()
	ctx := context.Background()
	ns, err := env.CreateNamespace(ctx, "scale")
	if err != nil {
		t.Fatal(err)
	}
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if _, err := gitSrv.CommitFiles(ns, gitserver.DefaultBranch, overlayFiles(f, ns), "the fleet"); err != nil {
		t.Fatal(err)
	}
	t.Logf("pushed %d overlays of %d ConfigMaps in %s", f.deployments, f.objects, time.Since(begin).Round(time.Millisecond))
	var lim limits
	if f.limits {
		lim = measureLimits(t, f)
	}
	c, err := client.New(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	// CAPSTAN_SCALE_PROFILES=<dir> keeps the daemon's profiles there
	// (measureIdle).
	profiles := os.Getenv("CAPSTAN_SCALE_PROFILES")
	proxy := startAPIProxy(t)
	d := startCapstan(t, proxy.kubeconfig(t), profiles != "")
	start := proxy.snapshot()

	begin = time.Now()
	createDeployments(t, c, ns, url, f)
	t.Logf("created %d ClusterDeployments in %s", f.deployments, time.Since(begin).Round(time.Millisecond))
	res := fleetResult{limits: lim}
	res.ready, res.toReady = waitAllReady(t, c, d, ns, f, begin)
	res.toReadyRequests, _, res.toReadyBy = proxy.snapshot().since(start)
	if res.ready < f.deployments {
		res.mem = d.memory(t)
		return res
	}

	measureIdle(t, d, proxy, f, profiles, &res)
	res.totalAPIRequests, _, _ = proxy.snapshot().since(start)
	d.stop() // a later run measures its own daemon alone
	if f.restart {
		res.restart = restartFleet(t, proxy, f)
	}
	return res
}

// restartFleet starts another daemon on the Ready fleet and measures its
// look (until every object was dry-run once) and then f.idle intervals.
func restartFleet(t testing.TB, proxy *apiProxy, f fleet) *restartResult {
	t.Helper()
	before := proxy.snapshot()
	begin := time.Now()
	d := startCapstan(t, proxy.kubeconfig(t), false)
	defer d.stop()
	objects := int64(f.deployments * f.objects)
	res := &restartResult{}
	deadline := time.Now().Add(f.deadline)
	for {
		_, _, byPath := proxy.snapshot().since(before)
		res.dryRuns, res.applies = 0, 0
		for k, n := range byPath {
			switch {
			case strings.HasPrefix(k, "PATCH(dry-run) ") && strings.Contains(k, "/configmaps/"):
				res.dryRuns += n
			case strings.HasPrefix(k, "PATCH ") && strings.Contains(k, "/configmaps/"):
				res.applies += n
			}
		}
		if res.dryRuns >= objects {
			break
		}
		if time.Now().After(deadline) || !d.running() {
			t.Fatalf("the restarted daemon dry-ran %d of the %d objects within %s", res.dryRuns, objects, f.deadline)
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.toLooked = time.Since(begin)
	res.requests, _, _ = proxy.snapshot().since(before)
	time.Sleep(f.interval) // every deployment polls once more after its look
	quiet := proxy.snapshot()
	time.Sleep(time.Duration(f.idle) * f.interval)
	res.idle, _, res.idleBy = proxy.snapshot().since(quiet)
	res.peak = d.memory(t).peak
	return res
}

// measureIdle lets one interval pass, for every deployment to poll once
// more after its Ready, then measures the daemon over f.idle intervals in
// which nothing changes, into res. With profiles set, it keeps heap
// profiles (all Ready, end of the window) and a CPU profile of the window
// there.
func measureIdle(t testing.TB, d *daemon, proxy *apiProxy, f fleet, profiles string, res *fleetResult) {
	t.Helper()
	if profiles != "" {
		d.saveProfile(t, profiles, "heap-ready.pb.gz", "heap", "gc=1")
	}
	time.Sleep(f.interval) // every deployment polls once more after its Ready
	before, git, rest, cpu := proxy.snapshot(), gitSrv.Requests(), d.metric(t, "rest_client_requests_total"), d.cpu(t)
	reconciles := d.metric(t, "controller_runtime_reconcile_total")
	windowStart := time.Now()
	window := time.Duration(f.idle) * f.interval
	var profiled sync.WaitGroup
	if profiles != "" {
		profiled.Go(func() {
			d.saveProfile(t, profiles, "cpu-idle.pb.gz", "profile", fmt.Sprintf("seconds=%d", int(window.Seconds())))
		})
	}
	time.Sleep(window)
	res.window = time.Since(windowStart)
	after := proxy.snapshot()
	res.cpu = d.cpu(t) - cpu
	res.gitRequests = gitSrv.Requests() - git
	res.restClient = d.metric(t, "rest_client_requests_total") - rest
	res.reconciles = d.metric(t, "controller_runtime_reconcile_total") - reconciles
	res.apiRequests, res.watches, res.apiByPath = after.since(before)
	res.goroutines = d.metric(t, "go_goroutines")
	res.heapInUse = d.metric(t, "go_memstats_heap_inuse_bytes")
	res.mem = d.memory(t)
	if profiles != "" {
		profiled.Wait()
		d.saveProfile(t, profiles, "heap-idle.pb.gz", "heap", "")
	}
}

// createDeployments creates the fleet's ClusterDeployments, a few at a
// time, each reading its own overlay.
func createDeployments(t testing.TB, c client.Client, ns, url string, f fleet) {
	t.Helper()
	names := make(chan int)
	errs := make(chan error, f.deployments)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range names {
				cd := &capstanv1.ClusterDeployment{
					ObjectMeta: metav1.ObjectMeta{Name: deploymentName(i), Namespace: ns},
					Spec: capstanv1.ClusterDeploymentSpec{
						Source:   &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url}},
						Path:     "fleet/" + deploymentName(i),
						Interval: &metav1.Duration{Duration: f.interval},
						Stages:   []capstanv1.StageSpec{{Name: "Apply", Select: capstanv1.Selector{Kinds: []string{"ConfigMap"}}}},
					},
				}
				if err := c.Create(context.Background(), cd); err != nil {
					errs <- fmt.Errorf("create %s: %w", cd.Name, err)
				}
			}
		})
	}
	for i := range f.deployments {
		names <- i
	}
	close(names)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// waitAllReady lists the fleet until every deployment is Ready at its
// generation, or the deadline passes or the daemon exits, and returns how
// many were Ready and when the last became so (from begin).
func waitAllReady(t testing.TB, c client.Client, d *daemon, ns string, f fleet, begin time.Time) (int, time.Duration) {
	t.Helper()
	deadline := begin.Add(f.deadline)
	lastLog := time.Now()
	for {
		list := &capstanv1.ClusterDeploymentList{}
		if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		ready := 0
		var notReady string
		for i := range list.Items {
			cd := &list.Items[i]
			switch {
			case isReady(cd):
				ready++
			case stalled(cd):
				t.Fatalf("a deployment stalled: %s", describe(cd))
			case notReady == "":
				notReady = describe(cd)
			}
		}
		took := time.Since(begin)
		if ready == f.deployments {
			return ready, took
		}
		if time.Now().After(deadline) || !d.running() {
			t.Errorf("%d of %d deployments Ready after %s (daemon running: %t); first not Ready: %s",
				ready, f.deployments, took.Round(time.Second), d.running(), notReady)
			return ready, took
		}
		if time.Since(lastLog) > 30*time.Second {
			m := d.memory(t)
			t.Logf("%s: %d of %d Ready; daemon RSS %d MiB, peak %d MiB", took.Round(time.Second), ready, f.deployments, m.rss>>20, m.peak>>20)
			lastLog = time.Now()
		}
		time.Sleep(time.Second)
	}
}

func isReady(cd *capstanv1.ClusterDeployment) bool {
	for _, c := range cd.Status.Conditions {
		if c.Type == capstanv1.ConditionReady {
			return c.Status == metav1.ConditionTrue && c.ObservedGeneration == cd.Generation
		}
	}
	return false
}

func stalled(cd *capstanv1.ClusterDeployment) bool {
	for _, c := range cd.Status.Conditions {
		if c.Type == capstanv1.ConditionStalled {
			return c.Status == metav1.ConditionTrue && c.ObservedGeneration == cd.Generation
		}
	}
	return false
}

func describe(cd *capstanv1.ClusterDeployment) string {
	for _, c := range cd.Status.Conditions {
		if c.Type == capstanv1.ConditionReady {
			return fmt.Sprintf("%s: Ready=%s %s: %s", cd.Name, c.Status, c.Reason, c.Message)
		}
	}
	return cd.Name + ": no Ready condition"
}

// logResult writes a run's figures, each with its unit.
func logResult(t testing.TB, f fleet, r fleetResult) {
	t.Helper()
	t.Logf("%d deployments x %d ConfigMaps, interval %s: all Ready %.1f s after the first create (%.1f deployments/s)",
		f.deployments, f.objects, f.interval, r.toReady.Seconds(), float64(f.deployments)/r.toReady.Seconds())
	t.Logf("daemon peak RSS (VmHWM) %d MiB; at the end RSS %d MiB (anonymous %d MiB, files %d MiB), Go heap in use %d MiB, %d goroutines",
		r.mem.peak>>20, r.mem.rss>>20, r.mem.anon>>20, r.mem.file>>20, int64(r.heapInUse)>>20, int64(r.goroutines))
	t.Logf("idle over %s (%d intervals): %.0f reconciles; CPU %.2f%% of one core (%s); API requests %d (%.1f per interval; watch starts %d apart; rest_client_requests_total +%.0f); git requests %d (%.1f per interval)",
		r.window.Round(time.Millisecond), f.idle, r.reconciles, 100*r.idleCPU(), r.cpu, r.apiRequests, r.perInterval(r.apiRequests, f),
		r.watches, r.restClient, r.gitRequests, r.perInterval(r.gitRequests, f))
	if r.apiRequests > 0 {
		t.Logf("idle API requests by path: %s", topPaths(r.apiByPath, 8))
	}
	t.Logf("API requests (watch starts apart) from the daemon's start to all Ready: %d (%.1f per deployment); per deployment by verb and resource: %s",
		r.toReadyRequests, float64(r.toReadyRequests)/float64(f.deployments), perDeployment(byKind(r.toReadyBy), f.deployments))
	t.Logf("API requests (watch starts apart) from the daemon's start to the end of the idle window: %d (%.1f per deployment)",
		r.totalAPIRequests, float64(r.totalAPIRequests)/float64(f.deployments))
	if rr := r.restart; rr != nil {
		t.Logf("restarted daemon: a dry run of every object %.1f s after its start; %d requests (%d dry runs, %d applies); peak RSS %d MiB; then %d API requests over %d intervals",
			rr.toLooked.Seconds(), rr.requests, rr.dryRuns, rr.applies, rr.peak>>20, rr.idle, f.idle)
	}
}

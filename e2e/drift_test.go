package e2e

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler"
)

// counted returns the target's kubeconfig pointed at a TLS proxy in front
// of the target's API server, the counter of the requests that pass
// through it (what the daemon asks the target, counted as startDaemon
// counts what it asks the cluster it runs in), and a function that stops
// the proxy: the target unreachable at that address. The proxy stops at
// the latest when the test ends, after the daemons started later.
func (tg *target) counted(t testing.TB) ([]byte, *requestCounter, func()) {
	t.Helper()
	counter := &requestCounter{}
	transport, err := rest.TransportFor(counter.wrap(tg.env.Config))
	if err != nil {
		t.Fatal(err)
	}
	upstream, err := url.Parse(tg.env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(upstream)
	// Watches stream: every event goes through at once.
	proxy.Transport, proxy.FlushInterval = transport, -1
	srv := httptest.NewUnstartedServer(proxy)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	var once sync.Once
	// httptest's Close waits for active connections, and a watch the
	// daemon reopens between CloseClientConnections and Close stays active
	// for good (it hung CI once): stop accepting first, then cut every
	// connection until Close returns.
	stop := func() {
		once.Do(func() {
			srv.Listener.Close()
			closed := make(chan struct{})
			go func() { srv.Close(); close(closed) }()
			for {
				srv.CloseClientConnections()
				select {
				case <-closed:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
	t.Cleanup(stop)
	cfg, err := clientcmd.Load(tg.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	for _, c := range cfg.Clusters {
		c.Server, c.CertificateAuthorityData, c.CertificateAuthority = srv.URL, ca, ""
	}
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data, counter, stop
}

// Drift in a cluster reached through a kubeconfig Secret (spec.kubeConfig,
// the target's API server behind a counting proxy) is corrected as in the
// cluster Capstan runs in, with one apply each to that cluster and none to
// the cluster Capstan runs in; a Ready deployment with nothing changed
// makes no request to either cluster. When the cluster becomes
// unreachable, its drift watches say so in the log (never the
// kubeconfig's token) and the deployment stays as it is.
func TestDriftIsCorrectedOnRemoteCluster(t *testing.T) {
	tg := startTarget(t)
	c := newClient(t)
	ns := newNamespace(t)
	url := pushOwned(t, ns, namespaceInA+cm("deleted", "A")+cm("edited", "A"))
	kubeconfig, remote, unplug := tg.counted(t)
	writeKubeconfigSecret(t, c, ns, "target-kubeconfig", kubeconfig)
	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	_, api := startDaemonWith(t, nil, func(o *reconciler.Options) { o.MetricsRegistry, o.Logger = reg, logs.logger() })
	spec := ownedSpec(url, ns, gitSecret(t, c, ns), "A")
	spec.KubeConfig = kubeconfigRef("target-kubeconfig")
	createDeployment(t, c, ns, "owned", spec)
	waitDeployment(t, c, ns, "owned", "Ready", isReady)
	if object(t, tg.client, configMapGVK, ns, "deleted") == nil || object(t, c, configMapGVK, ns, "deleted") != nil {
		t.Fatal("the deployment's ConfigMaps are not in the target only")
	}
	t.Logf("Ready: %d requests to the target so far", remote.all())

	assertDriftCorrected(t, driftRun{client: c, ns: ns, api: api, reg: reg, objects: tg.client, objectsAPI: remote,
		where: " in the cluster of Secret " + ns + "/target-kubeconfig"})
	if n := api.total("PATCH", "/configmaps/"); n != 0 {
		t.Errorf("%d ConfigMap applies to the cluster Capstan runs in, want 0", n)
	}
	tg.assertNoToken(t, c, ns, "owned")

	// The target goes away: logged, retried, and nothing else changes.
	before := getDeployment(t, c, ns, "owned")
	unplug()
	waitFor(t, "the drift watches of the target logging that they cannot reach it", func() (bool, error) {
		return strings.Contains(logs.String(), "drift watch cannot list or watch; retrying"), nil
	})
	requests := api.all()
	infoRefs := "/" + ns + ".git/info/refs"
	polls := gitSrv.RequestsTo(infoRefs)
	waitFor(t, "three more polls of the remote", func() (bool, error) { return gitSrv.RequestsTo(infoRefs) >= polls+3, nil })
	if n := api.all() - requests; n != 0 {
		t.Errorf("target unreachable: %d requests to the cluster Capstan runs in during three polls, want 0", n)
	}
	if after := getDeployment(t, c, ns, "owned"); after.ResourceVersion != before.ResourceVersion || !isReady(after) {
		t.Errorf("the deployment changed while only its drift watches could not reach the target: %s", describe(after))
	}
	if strings.Contains(logs.String(), tg.token) {
		t.Error("the daemon's log holds the kubeconfig's token")
	}
}

// driftRun is a Ready deployment "owned" whose ConfigMaps "deleted" and
// "edited" were applied to one cluster, and how that cluster is reached.
type driftRun struct {
	client client.Client        // the cluster Capstan runs in
	ns     string               // of the deployment and its ConfigMaps
	api    *requestCounter      // the daemon's requests to the cluster it runs in
	reg    *prometheus.Registry // the daemon's metrics
	// objects reads and edits the cluster the ConfigMaps were applied
	// to, uncounted; objectsAPI counts the daemon's requests there (api
	// again when that is the cluster Capstan runs in).
	objects    client.Client
	objectsAPI *requestCounter
	// where is what events say of that cluster after what happened.
	where string
}

// assertDriftCorrected: the applied ConfigMap deleted, and a field
// Capstan applied changed by another field manager, are both restored,
// with one apply each; a Ready deployment with nothing changed makes no
// request to either cluster; a deployment that says report only reports.
func assertDriftCorrected(t *testing.T, d driftRun) {
	t.Helper()
	ns, api := d.ns, d.objectsAPI
	deleted, edited := appliesTo(api, ns, "configmaps", "deleted"), appliesTo(api, ns, "configmaps", "edited")
	gone := &corev1.ConfigMap{}
	gone.Namespace, gone.Name = ns, "deleted"
	begin := time.Now()
	if err := d.objects.Delete(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted ConfigMap restored", func() (bool, error) { return object(t, d.objects, configMapGVK, ns, "deleted") != nil, nil })
	t.Logf("deleted object restored %s after the delete", time.Since(begin).Round(time.Millisecond))

	live := &corev1.ConfigMap{}
	if err := d.objects.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "edited"}, live); err != nil {
		t.Fatal(err)
	}
	live.Data["k"] = "edited by hand"
	begin = time.Now()
	if err := d.objects.Update(context.Background(), live, client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the edited field restored", func() (bool, error) {
		obj := object(t, d.objects, configMapGVK, ns, "edited")
		return obj != nil && obj.Object["data"].(map[string]any)["k"] == "v", nil
	})
	t.Logf("edited field restored %s after the edit", time.Since(begin).Round(time.Millisecond))
	if n := appliesTo(api, ns, "configmaps", "deleted") - deleted; n != 1 {
		t.Errorf("the deleted ConfigMap was applied %d times, want 1", n)
	}
	if n := appliesTo(api, ns, "configmaps", "edited") - edited; n != 1 {
		t.Errorf("the edited ConfigMap was applied %d times, want 1", n)
	}
	// A correction is counted after its apply answered: the restored
	// object may show before the count.
	waitFor(t, "two corrections counted", func() (bool, error) { return driftCount(t, d.reg, ns, "owned", "corrected") >= 2, nil })
	if n := driftCount(t, d.reg, ns, "owned", "corrected"); n != 2 {
		t.Errorf("capstan_drift_corrections_total{action=corrected} = %v, want 2", n)
	}
	// Events of one reason on one object fold into one series; its note
	// is the first one's. The second correction's event writes the
	// series: wait for it, as the requests counted next would see it.
	waitFor(t, "both DriftCorrected events recorded", func() (bool, error) {
		return eventOccurrences(t, d.client, ns, "owned", "DriftCorrected") >= 2, nil
	})
	if msg, want := eventMessages(t, d.client, ns, "owned", "DriftCorrected"), "ConfigMap/"+ns+"/deleted was deleted"+d.where+";"; !strings.Contains(msg, want) {
		t.Errorf("DriftCorrected event %q does not say %q", msg, want)
	}

	// Nothing changes any more: three polls cost no request to either cluster.
	requests, objectRequests := d.api.all(), api.all()
	infoRefs := "/" + ns + ".git/info/refs"
	polls := gitSrv.RequestsTo(infoRefs)
	waitFor(t, "three more polls of the remote", func() (bool, error) { return gitSrv.RequestsTo(infoRefs) >= polls+3, nil })
	if n := d.api.all() - requests; n != 0 {
		t.Errorf("Ready and unchanged: %d requests to the cluster Capstan runs in during three polls, want 0", n)
	}
	if n := api.all() - objectRequests; api != d.api && n != 0 {
		t.Errorf("Ready and unchanged: %d requests to the cluster of the ConfigMaps during three polls, want 0", n)
	}

	// report: the drift is told, not corrected.
	cd := getDeployment(t, d.client, ns, "owned")
	cd.Spec.Drift = capstanv1.DriftReport
	if err := d.client.Update(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, d.client, ns, "owned", "Ready at the new generation", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.ObservedGeneration == cd.Generation && isReady(cd)
	})
	if err := d.objects.Delete(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a DriftDetected event", func() (bool, error) { return eventReasons(t, d.client, ns, "owned")["DriftDetected"] > 0, nil })
	if n := driftCount(t, d.reg, ns, "owned", "reported"); n != 1 {
		t.Errorf("capstan_drift_corrections_total{action=reported} = %v, want 1", n)
	}
	if object(t, d.objects, configMapGVK, ns, "deleted") != nil {
		t.Error("with spec.drift: report, the deleted ConfigMap was restored")
	}
}

// waitDriftWatch waits until the daemon's drift watcher (logging to logs)
// holds the objects of kind in the cluster Capstan runs in: from then on
// every write to them reaches it as an event. A write made before is
// listed as it is, with nothing to compare it to: only a deletion is
// seen then (the object is missing).
func waitDriftWatch(t testing.TB, logs *logBuffer, kind string) {
	t.Helper()
	waitFor(t, "the drift watch of "+kind+" synced", func() (bool, error) {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, `"drift watch synced"`) && strings.Contains(line, `"cluster"="local"`) && strings.Contains(line, `"kind"="`+kind+`"`) {
				return true, nil
			}
		}
		return false, nil
	})
}

// A data key Capstan applied, removed by hand by a writer left owning no
// field (an update as kubectl-edit that only deletes the key), is drift:
// corrected with one apply, an event saying that a field Capstan manages
// was removed and that no field manager is left to name, and counted;
// with spec.drift: report it is only told and counted; with ignore,
// nothing happens.
func TestDriftOfARemovedFieldIsCorrected(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	objects := cmWithGone("shrunk")
	url := pushOwned(t, ns, objects)
	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	_, api := startDaemonWith(t, nil, func(o *reconciler.Options) { o.MetricsRegistry, o.Logger = reg, logs.logger() })
	createDeployment(t, c, ns, "owned", ownedSpec(url, ns, gitSecret(t, c, ns), "A"))
	waitDeployment(t, c, ns, "owned", "Ready", isReady)
	waitDriftWatch(t, logs, "ConfigMap")

	removeKey := func() {
		t.Helper()
		live := &corev1.ConfigMap{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "shrunk"}, live); err != nil {
			t.Fatal(err)
		}
		delete(live.Data, "gone")
		if err := c.Update(context.Background(), live, client.FieldOwner("kubectl-edit")); err != nil {
			t.Fatal(err)
		}
		for _, mf := range live.ManagedFields {
			if mf.Manager == "kubectl-edit" {
				t.Fatalf("the API server kept an entry for the writer (%s): the case under test is the one where none is left", mf.FieldsV1)
			}
		}
	}
	gone := func() any {
		return object(t, c, configMapGVK, ns, "shrunk").Object["data"].(map[string]any)["gone"]
	}

	applies := appliesTo(api, ns, "configmaps", "shrunk")
	removeKey()
	waitFor(t, "the removed key restored", func() (bool, error) { return gone() == "v", nil })
	if n := appliesTo(api, ns, "configmaps", "shrunk") - applies; n != 1 {
		t.Errorf("the ConfigMap was applied %d times to restore its key, want 1", n)
	}
	waitFor(t, "a DriftCorrected event", func() (bool, error) { return eventReasons(t, c, ns, "owned")["DriftCorrected"] > 0, nil })
	want := "ConfigMap/" + ns + "/shrunk was changed: a field Capstan manages (.data.gone) was removed by a writer that kept no field of the object, so no field manager is left to name; applied it again"
	if msg := eventMessages(t, c, ns, "owned", "DriftCorrected"); msg != want {
		t.Errorf("DriftCorrected event %q, want %q", msg, want)
	}
	if n := driftCount(t, reg, ns, "owned", "corrected"); n != 1 {
		t.Errorf("capstan_drift_corrections_total{action=corrected} = %v, want 1", n)
	}

	// report: told and counted, the key stays removed.
	setDrift(t, c, ns, capstanv1.DriftReport)
	removeKey()
	waitFor(t, "a DriftDetected event", func() (bool, error) { return eventReasons(t, c, ns, "owned")["DriftDetected"] > 0, nil })
	if msg := eventMessages(t, c, ns, "owned", "DriftDetected"); !strings.Contains(msg, "(.data.gone) was removed by a writer that kept no field") || !strings.Contains(msg, "spec.drift is report") {
		t.Errorf("DriftDetected event %q does not say that .data.gone was removed and stays so", msg)
	}
	if n := driftCount(t, reg, ns, "owned", "reported"); n != 1 {
		t.Errorf("capstan_drift_corrections_total{action=reported} = %v, want 1", n)
	}
	if got := gone(); got != nil {
		t.Errorf("with spec.drift: report, the removed key came back (%v)", got)
	}

	// ignore: the new generation applies the key again; removed after
	// that, nothing notices.
	setDrift(t, c, ns, capstanv1.DriftIgnore)
	waitFor(t, "the key applied at the new generation", func() (bool, error) { return gone() == "v", nil })
	applies, events := appliesTo(api, ns, "configmaps", "shrunk"), eventReasons(t, c, ns, "owned")
	removeKey()
	infoRefs := "/" + ns + ".git/info/refs"
	polls := gitSrv.RequestsTo(infoRefs)
	waitFor(t, "three more polls of the remote", func() (bool, error) { return gitSrv.RequestsTo(infoRefs) >= polls+3, nil })
	if n := appliesTo(api, ns, "configmaps", "shrunk") - applies; n != 0 || gone() != nil {
		t.Errorf("with spec.drift: ignore, %d applies and key %v after it was removed, want none and nil", n, gone())
	}
	after := eventReasons(t, c, ns, "owned")
	if after["DriftCorrected"] != events["DriftCorrected"] || after["DriftDetected"] != events["DriftDetected"] {
		t.Errorf("with spec.drift: ignore, drift events went from %v to %v", events, after)
	}
	if n := driftCount(t, reg, ns, "owned", "corrected") + driftCount(t, reg, ns, "owned", "reported"); n != 2 {
		t.Errorf("capstan_drift_corrections_total = %v in all, want 2 (none under ignore)", n)
	}
}

// setDrift sets spec.drift of deployment "owned" and waits until it is
// Ready at that generation.
func setDrift(t testing.TB, c client.Client, ns string, drift capstanv1.DriftPolicy) {
	t.Helper()
	cd := getDeployment(t, c, ns, "owned")
	cd.Spec.Drift = drift
	if err := c.Update(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c, ns, "owned", "Ready with spec.drift: "+string(drift), func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.ObservedGeneration == cd.Generation && isReady(cd)
	})
}

// An object of an early stage edited while a later stage still waits is
// drift too: the drift watch follows the walk stage by stage, so the
// removal is seen when it happens and corrected, with one apply, once the
// deployment is Ready. Watched only from Ready on, the object would be
// listed already edited, and nothing would change it back.
func TestDriftWhileALaterStageWaitsIsCorrectedAtReady(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	objects := cmWithGone("early") + cm("gate", "B")
	url := pushOwned(t, ns, objects)
	reg := prometheus.NewRegistry()
	logs := &logBuffer{}
	_, api := startDaemonWith(t, nil, func(o *reconciler.Options) { o.MetricsRegistry, o.Logger = reg, logs.logger() })
	spec := ownedSpec(url, ns, gitSecret(t, c, ns), "A", "B")
	spec.Stages[1].ReadyWhen = []capstanv1.ReadinessCheck{{Kind: "ConfigMap", CEL: "has(object.data.open)", Message: "waiting for the gate"}}
	createDeployment(t, c, ns, "owned", spec)
	waitDeployment(t, c, ns, "owned", "stage B waiting for the gate", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "B").State == capstanv1.StageInProgress && strings.Contains(stage(cd, "B").Message, "waiting for the gate")
	})
	waitDriftWatch(t, logs, "ConfigMap")

	applies := appliesTo(api, ns, "configmaps", "early")
	live := &corev1.ConfigMap{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "early"}, live); err != nil {
		t.Fatal(err)
	}
	delete(live.Data, "gone")
	if err := c.Update(context.Background(), live, client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}
	// Stage B is not Ready: nothing is corrected before the walk is done.
	if cd := getDeployment(t, c, ns, "owned"); isReady(cd) {
		t.Fatalf("the deployment is Ready before the gate opened: %s", describe(cd))
	}

	gate := &corev1.ConfigMap{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "gate"}, gate); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(gate.DeepCopy())
	gate.Data["open"] = "yes"
	if err := c.Patch(context.Background(), gate, patch, client.FieldOwner("gatekeeper")); err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c, ns, "owned", "Ready", isReady)
	waitFor(t, "the key removed while stage B waited restored", func() (bool, error) {
		return object(t, c, configMapGVK, ns, "early").Object["data"].(map[string]any)["gone"] == "v", nil
	})
	if n := appliesTo(api, ns, "configmaps", "early") - applies; n != 1 {
		t.Errorf("the ConfigMap was applied %d times after the edit, want 1 (the correction)", n)
	}
	// The event is recorded after the apply answered, and the correction
	// counted before it: the restored key shows neither.
	waitFor(t, "a DriftCorrected event saying that .data.gone of early was removed", func() (bool, error) {
		msg := eventMessages(t, c, ns, "owned", "DriftCorrected")
		return strings.Contains(msg, "ConfigMap/"+ns+"/early") && strings.Contains(msg, "(.data.gone) was removed"), fmt.Errorf("DriftCorrected events %q", msg)
	})
	if n := driftCount(t, reg, ns, "owned", "corrected"); n != 1 {
		t.Errorf("capstan_drift_corrections_total{action=corrected} = %v, want 1", n)
	}
}

// What happened while no Capstan ran is found when one starts: the watch
// judges a write against the object just before it, and sees neither a
// field taken over nor one removed before it began; the new daemon checks
// every object of a Ready deployment once with a dry run, and applies
// again, once each, what was deleted, taken over or removed, and nothing
// else. After that look, an unchanged deployment costs no request again.
func TestDriftWhileNoCapstanRanIsFoundAtStart(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	objects := cmWithGone("removed") +
		cm("taken", "A") + cm("deleted", "A") + cm("unchanged", "A")
	url := pushOwned(t, ns, objects)
	first, _ := startDaemon(t, nil)
	createDeployment(t, c, ns, "owned", ownedSpec(url, ns, gitSecret(t, c, ns), "A"))
	waitDeployment(t, c, ns, "owned", "Ready", isReady)
	stopDaemon(first)

	// While no Capstan runs: a key removed, a value taken, an object gone.
	edit := func(name string, change func(*corev1.ConfigMap)) {
		t.Helper()
		live := &corev1.ConfigMap{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, live); err != nil {
			t.Fatal(err)
		}
		change(live)
		if err := c.Update(context.Background(), live, client.FieldOwner("kubectl-edit")); err != nil {
			t.Fatal(err)
		}
	}
	edit("removed", func(cm *corev1.ConfigMap) { delete(cm.Data, "gone") })
	edit("taken", func(cm *corev1.ConfigMap) { cm.Data["k"] = "by hand" })
	if err := c.Delete(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deleted"}}); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	_, api := startDaemonWith(t, nil, func(o *reconciler.Options) { o.MetricsRegistry = reg })
	data := func(name string) map[string]any {
		obj := object(t, c, configMapGVK, ns, name)
		if obj == nil {
			return nil
		}
		d, _ := obj.Object["data"].(map[string]any)
		return d
	}
	waitFor(t, "the three ConfigMaps as applied again", func() (bool, error) {
		return data("removed")["gone"] == "v" && data("taken")["k"] == "v" && data("deleted") != nil, nil
	})
	waitFor(t, "three corrections counted", func() (bool, error) {
		return driftCount(t, reg, ns, "owned", "corrected") >= 3, nil
	})
	for name, want := range map[string]int{"removed": 1, "taken": 1, "deleted": 1, "unchanged": 0} {
		if n := appliesTo(api, ns, "configmaps", name); n != want {
			t.Errorf("ConfigMap %s applied %d times by the new daemon, want %d", name, n, want)
		}
	}
	if n := driftCount(t, reg, ns, "owned", "corrected"); n != 3 {
		t.Errorf("capstan_drift_corrections_total{action=corrected} = %v, want 3", n)
	}
	// Each event is recorded after its correction is counted; the second
	// one writes the series of the first (then they are folded until a
	// refresh every half hour): wait for it, as the requests counted next
	// would see it.
	waitFor(t, "the DriftCorrected events recorded", func() (bool, error) {
		return eventOccurrences(t, c, ns, "owned", "DriftCorrected") >= 2, nil
	})
	if msg := eventMessages(t, c, ns, "owned", "DriftCorrected"); !strings.Contains(msg, "while no Capstan watched it") {
		t.Errorf("DriftCorrected events %q do not say the change happened while no Capstan watched", msg)
	}

	// Looked at once: from now on, nothing changed costs nothing.
	requests := api.all()
	infoRefs := "/" + ns + ".git/info/refs"
	polls := gitSrv.RequestsTo(infoRefs)
	waitFor(t, "three more polls of the remote", func() (bool, error) { return gitSrv.RequestsTo(infoRefs) >= polls+3, nil })
	if n := api.all() - requests; n != 0 {
		t.Errorf("%d API requests over three polls of an unchanged, Ready deployment after the look, want 0", n)
	}
}

// The look of a new daemon reaches the clusters a deployment's stages act
// on through kubeconfig Secrets too; one that does not answer then is
// skipped and logged, and the deployment stays as it is, as its drift
// watch leaves it.
func TestDriftWhileNoCapstanRanIsFoundAtStartOnRemoteCluster(t *testing.T) {
	tg := startTarget(t)
	c := newClient(t)
	ns := newNamespace(t)
	removed := cmWithGone("removed")
	url := pushOwned(t, ns, namespaceInA+removed)
	kubeconfig, remote, unplug := tg.counted(t)
	writeKubeconfigSecret(t, c, ns, "target-kubeconfig", kubeconfig)
	first, _ := startDaemon(t, nil)
	spec := ownedSpec(url, ns, gitSecret(t, c, ns), "A")
	spec.KubeConfig = kubeconfigRef("target-kubeconfig")
	createDeployment(t, c, ns, "owned", spec)
	waitDeployment(t, c, ns, "owned", "Ready", isReady)
	stopDaemon(first)

	live := &corev1.ConfigMap{}
	if err := tg.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "removed"}, live); err != nil {
		t.Fatal(err)
	}
	delete(live.Data, "gone")
	if err := tg.client.Update(context.Background(), live, client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}
	applies := appliesTo(remote, ns, "configmaps", "removed")
	second, _ := startDaemon(t, nil)
	waitFor(t, "the key removed in the target while no daemon ran restored", func() (bool, error) {
		return object(t, tg.client, configMapGVK, ns, "removed").Object["data"].(map[string]any)["gone"] == "v", nil
	})
	if n := appliesTo(remote, ns, "configmaps", "removed") - applies; n != 1 {
		t.Errorf("the target's ConfigMap applied %d times by the new daemon, want 1", n)
	}
	// Stopped once the correction is recorded: the next daemon must find
	// the deployment Ready, as this one left it, to look rather than walk.
	waitDeployment(t, c, ns, "owned", "Ready after the correction", isReady)
	stopDaemon(second)

	// The target gone when the next daemon starts: logged, nothing else.
	unplug()
	before := getDeployment(t, c, ns, "owned")
	logs := &logBuffer{}
	startDaemonWith(t, nil, func(o *reconciler.Options) { o.Logger = logs.logger() })
	// A new daemon looks at every deployment the package's earlier tests
	// left in the control plane, four at a time: under load this one's
	// turn may come after waitTimeout.
	waitForWithin(t, 2*waitTimeout, "the look logging that it cannot reach the target", func() (bool, error) {
		return strings.Contains(logs.String(), "cannot check the objects applied to another cluster"), nil
	})
	infoRefs := "/" + ns + ".git/info/refs"
	polls := gitSrv.RequestsTo(infoRefs)
	waitFor(t, "three more polls of the remote", func() (bool, error) { return gitSrv.RequestsTo(infoRefs) >= polls+3, nil })
	if after := getDeployment(t, c, ns, "owned"); after.ResourceVersion != before.ResourceVersion || !isReady(after) {
		t.Errorf("the deployment changed because its target could not be looked at: %s", describe(after))
	}
	if strings.Contains(logs.String(), tg.token) {
		t.Error("the daemon's log holds the kubeconfig's token")
	}
}

// The look after a start follows spec.drift: under report it tells and
// counts what changed while no Capstan watched and leaves it; under
// ignore it does not look at all (no dry run).
func TestDriftWhileNoCapstanRanFollowsTheDriftPolicy(t *testing.T) {
	c := newClient(t)
	first, _ := startDaemon(t, nil)
	namespaces := map[capstanv1.DriftPolicy]string{}
	for _, policy := range []capstanv1.DriftPolicy{capstanv1.DriftReport, capstanv1.DriftIgnore} {
		ns := newNamespace(t)
		objects := cmWithGone("removed")
		url := pushOwned(t, ns, objects)
		spec := ownedSpec(url, ns, gitSecret(t, c, ns), "A")
		spec.Drift = policy
		createDeployment(t, c, ns, "owned", spec)
		waitDeployment(t, c, ns, "owned", "Ready", isReady)
		namespaces[policy] = ns
	}
	stopDaemon(first)
	for _, ns := range namespaces {
		live := &corev1.ConfigMap{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "removed"}, live); err != nil {
			t.Fatal(err)
		}
		delete(live.Data, "gone")
		if err := c.Update(context.Background(), live, client.FieldOwner("kubectl-edit")); err != nil {
			t.Fatal(err)
		}
	}

	reg := prometheus.NewRegistry()
	_, api := startDaemonWith(t, nil, func(o *reconciler.Options) { o.MetricsRegistry = reg })
	reported, ignored := namespaces[capstanv1.DriftReport], namespaces[capstanv1.DriftIgnore]
	waitFor(t, "a DriftDetected event for what changed while no Capstan watched", func() (bool, error) {
		return strings.Contains(eventMessages(t, c, reported, "owned", "DriftDetected"), "while no Capstan watched it; spec.drift is report"), nil
	})
	if n := driftCount(t, reg, reported, "owned", "reported"); n != 1 {
		t.Errorf("capstan_drift_corrections_total{action=reported} = %v, want 1", n)
	}
	// Both polled three more times: nothing applied in either, and the
	// ignored deployment was not even looked at.
	polls := map[string]int64{}
	for _, ns := range namespaces {
		polls[ns] = gitSrv.RequestsTo("/" + ns + ".git/info/refs")
	}
	waitFor(t, "three more polls of each remote", func() (bool, error) {
		for ns, n := range polls {
			if gitSrv.RequestsTo("/"+ns+".git/info/refs") < n+3 {
				return false, nil
			}
		}
		return true, nil
	})
	for _, ns := range namespaces {
		if n := appliesTo(api, ns, "configmaps", "removed"); n != 0 {
			t.Errorf("ConfigMap %s/removed applied %d times, want 0", ns, n)
		}
		if gone := object(t, c, configMapGVK, ns, "removed").Object["data"].(map[string]any)["gone"]; gone != nil {
			t.Errorf("ConfigMap %s/removed got its key back (%v)", ns, gone)
		}
	}
	if n := api.total("PATCH(dry-run)", "/namespaces/"+ignored+"/"); n != 0 {
		t.Errorf("%d dry runs in the namespace of the deployment with spec.drift: ignore, want none", n)
	}
	if msg := eventMessages(t, c, ignored, "owned", "DriftDetected") + eventMessages(t, c, ignored, "owned", "DriftCorrected"); msg != "" {
		t.Errorf("drift events for the deployment with spec.drift: ignore: %q", msg)
	}
}

// cmWithGone is cm(name, "A") with a second data key, gone: the key the
// tests remove by hand.
func cmWithGone(name string) string {
	return strings.Replace(cm(name, "A"), "data: {k: v}", "data: {k: v, gone: v}", 1)
}

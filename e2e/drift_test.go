package e2e

import (
	"context"
	"encoding/pem"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
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
	stop := func() {
		once.Do(func() {
			srv.CloseClientConnections()
			srv.Close()
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
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	namespace := "apiVersion: v1\nkind: Namespace\nmetadata: {name: '${NS}', labels: {capstan.dev/stage: A}}\n---\n"
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, ownedRepo(namespace+cm("deleted", "A")+cm("edited", "A")), "v1"); err != nil {
		t.Fatal(err)
	}
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
	if n := driftCount(t, d.reg, ns, "owned", "corrected"); n != 2 {
		t.Errorf("capstan_drift_corrections_total{action=corrected} = %v, want 2", n)
	}
	// Events of one reason on one object fold into one series; its note
	// is the first one's.
	waitFor(t, "a DriftCorrected event", func() (bool, error) { return eventReasons(t, d.client, ns, "owned")["DriftCorrected"] > 0, nil })
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

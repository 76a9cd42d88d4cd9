package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/stages"
)

// remoteFiles is an overlay of two stages: Remote (a Namespace and a
// ConfigMap that only the test marks ready) goes to the target cluster,
// Local (a ConfigMap) to the cluster Capstan runs in.
func remoteFiles() map[string]string {
	return map[string]string{
		"clusters/remote/kustomization.yaml": `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [remote.yaml, local.yaml]
`,
		"clusters/remote/remote.yaml": `apiVersion: v1
kind: Namespace
metadata:
  name: ${NS}
  labels: {capstan.dev/stage: Remote}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: remote-settings
  namespace: ${NS}
  labels: {capstan.dev/stage: Remote}
data: {where: target}
`,
		"clusters/remote/local.yaml": `apiVersion: v1
kind: ConfigMap
metadata:
  name: local-settings
  namespace: ${NS}
  labels: {capstan.dev/stage: Local}
data: {where: home}
`,
	}
}

const remoteReadyAnnotation = "test.capstan.dev/ready"

func remoteSpec(url, ns, gitSecretName string, remote *capstanv1.KubeConfigReference) capstanv1.ClusterDeploymentSpec {
	return capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, Ref: capstanv1.GitRef{Branch: "main"},
			SecretRef: &capstanv1.LocalObjectReference{Name: gitSecretName},
		}},
		Path:       "clusters/remote",
		Substitute: map[string]string{"NS": ns},
		Interval:   &metav1.Duration{Duration: 500 * time.Millisecond},
		Stages: []capstanv1.StageSpec{
			{Name: "Remote", KubeConfig: remote, ReadyWhen: []capstanv1.ReadinessCheck{{
				Kind:    "ConfigMap",
				CEL:     `has(object.metadata.annotations) && '` + remoteReadyAnnotation + `' in object.metadata.annotations`,
				Message: "waiting for the test to mark the remote copy",
			}}},
			{Name: "Local"},
		},
	}
}

// kubeconfigRef names key value of Secret name, as Cluster API writes it.
func kubeconfigRef(name string) *capstanv1.KubeConfigReference {
	return &capstanv1.KubeConfigReference{SecretRef: &capstanv1.SecretKeyReference{Name: name}}
}

// writeKubeconfigSecret creates or updates Secret name in ns with value
// under key value.
func writeKubeconfigSecret(t testing.TB, c client.Client, ns, name string, value []byte) {
	t.Helper()
	ctx := context.Background()
	s := &corev1.Secret{}
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s)
	switch {
	case apierrors.IsNotFound(err):
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: map[string][]byte{"value": value}}
		err = c.Create(ctx, s)
	case err == nil:
		s.Data = map[string][]byte{"value": value}
		err = c.Update(ctx, s)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// target is the second control plane the remote stages act on.
type target struct {
	env        *testenv.Env
	client     client.Client
	kubeconfig []byte
	token      string
}

func startTarget(t *testing.T) *target {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tenv, err := testenv.Start(ctx, testenv.Options{Progress: io.Discard})
	if err != nil {
		t.Fatalf("start the target control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := tenv.Stop(); err != nil {
			t.Errorf("stop the target control plane: %v", err)
		}
	})
	data, err := os.ReadFile(tenv.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		t.Fatal(err)
	}
	token := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo].Token
	if token == "" {
		t.Fatal("the target's kubeconfig has no token to look for")
	}
	c, err := client.New(tenv.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return &target{env: tenv, client: c, kubeconfig: data, token: token}
}

// unreachableKubeconfig is the target's kubeconfig pointed at a port of
// loopback that nothing listens on.
func (tg *target) unreachableKubeconfig(t testing.TB) []byte {
	t.Helper()
	return tg.kubeconfigAt(t, freeAddr(t))
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// serverAddr is the target API server's host:port.
func (tg *target) serverAddr(t testing.TB) string {
	t.Helper()
	cfg, err := clientcmd.Load(tg.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		return strings.TrimPrefix(c.Server, "https://")
	}
	t.Fatal("the target's kubeconfig has no cluster")
	return ""
}

// forward serves addr by forwarding every connection to the target's API
// server until the test ends: the target's "coming back" at an address
// its kubeconfig already names.
func (tg *target) forward(t testing.TB, addr string) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	server := tg.serverAddr(t)
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", server)
			if err != nil {
				_ = in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
}

// kubeconfigAt is the target's kubeconfig pointed at addr.
func (tg *target) kubeconfigAt(t testing.TB, addr string) []byte {
	t.Helper()
	cfg, err := clientcmd.Load(tg.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + addr
	}
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// assertNoToken fails when the target's token shows in the deployment's
// status or events.
func (tg *target) assertNoToken(t testing.TB, c client.Client, ns, name string) {
	t.Helper()
	status, err := json.Marshal(getDeployment(t, c, ns, name).Status)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(status), tg.token) {
		t.Errorf("the kubeconfig's token is in the status of %s/%s", ns, name)
	}
	events := &eventsv1.EventList{}
	if err := c.List(context.Background(), events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if strings.Contains(e.Note, tg.token) || strings.Contains(e.Reason, tg.token) {
			t.Errorf("the kubeconfig's token is in event %s: %s", e.Reason, e.Note)
		}
	}
}

// consecutiveFailures reads capstan_reconcile_consecutive_failures of a
// deployment from reg; -1 when the series is missing.
func consecutiveFailures(t testing.TB, reg *prometheus.Registry, ns, name string) float64 {
	t.Helper()
	return metricValue(t, reg, "capstan_reconcile_consecutive_failures", map[string]string{"namespace": ns, "cluster": name}, -1)
}

// metricValue reads from reg the gauge or counter of family name whose
// labels include want; missing when there is none.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, want map[string]string, missing float64) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return missing
}

func newRemoteRepo(t testing.TB, ns string) string {
	t.Helper()
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, remoteFiles(), "remote overlay"); err != nil {
		t.Fatal(err)
	}
	return url
}

func stageWaits(name string, says ...string) func(*capstanv1.ClusterDeployment) bool {
	return func(cd *capstanv1.ClusterDeployment) bool {
		st := stage(cd, name)
		if st.State != capstanv1.StageInProgress {
			return false
		}
		for _, s := range says {
			if !strings.Contains(st.Message, s) {
				return false
			}
		}
		return true
	}
}

func TestStagesOnRemoteClusters(t *testing.T) {
	tg := startTarget(t)

	t.Run("each stage lands in its own cluster and is judged there", func(t *testing.T) {
		c := newClient(t)
		ns := newNamespace(t)
		url := newRemoteRepo(t, ns)
		writeKubeconfigSecret(t, c, ns, "target-kubeconfig", tg.kubeconfig)
		startDaemon(t, nil)
		createDeployment(t, c, ns, "remote", remoteSpec(url, ns, gitSecret(t, c, ns), kubeconfigRef("target-kubeconfig")))

		cd := waitDeployment(t, c, ns, "remote", "stage Remote waiting for its mark", stageWaits("Remote", "ConfigMap/"+ns+"/remote-settings"))
		remote := object(t, tg.client, configMapGVK, ns, "remote-settings")
		if remote == nil {
			t.Fatalf("stage Remote waits but its ConfigMap is not in the target: %s", describe(cd))
		}
		if object(t, c, configMapGVK, ns, "remote-settings") != nil {
			t.Error("stage Remote's ConfigMap was applied to the cluster Capstan runs in too")
		}
		if object(t, c, configMapGVK, ns, "local-settings") != nil || object(t, tg.client, configMapGVK, ns, "local-settings") != nil {
			t.Error("stage Local was applied before stage Remote was ready")
		}
		var managers []string
		for _, f := range remote.GetManagedFields() {
			managers = append(managers, f.Manager)
		}
		if !strings.Contains(strings.Join(managers, ","), stages.FieldManager) {
			t.Errorf("the remote ConfigMap's field managers are %v, want %s", managers, stages.FieldManager)
		}

		// Only the remote copy is marked: readiness must be read there.
		patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"`+remoteReadyAnnotation+`":"true"}}}`))
		if err := tg.client.Patch(context.Background(), remote, patch); err != nil {
			t.Fatal(err)
		}
		cd = waitDeployment(t, c, ns, "remote", "Ready", isReady)
		if object(t, c, configMapGVK, ns, "local-settings") == nil {
			t.Errorf("stage Local's ConfigMap is not in the cluster Capstan runs in: %s", describe(cd))
		}
		if object(t, tg.client, configMapGVK, ns, "local-settings") != nil {
			t.Error("stage Local's ConfigMap was applied to the target")
		}
		tg.assertNoToken(t, c, ns, "remote")
	})

	t.Run("an unreachable cluster is waited for and recovers", func(t *testing.T) {
		c := newClient(t)
		ns := newNamespace(t)
		url := newRemoteRepo(t, ns)
		writeKubeconfigSecret(t, c, ns, "down-kubeconfig", tg.unreachableKubeconfig(t))
		reg := prometheus.NewRegistry()
		startDaemonWith(t, nil, func(o *reconciler.Options) { o.MetricsRegistry = reg })
		// The whole deployment targets the cluster: both stages go there.
		spec := remoteSpec(url, ns, gitSecret(t, c, ns), nil)
		spec.KubeConfig = kubeconfigRef("down-kubeconfig")
		createDeployment(t, c, ns, "down", spec)

		cd := waitDeployment(t, c, ns, "down", "stage Remote waiting for its unreachable cluster",
			stageWaits("Remote", "cluster of Secret "+ns+"/down-kubeconfig unreachable", "connection refused"))
		if st := condition(cd, capstanv1.ConditionStalled); st != nil && st.Status == metav1.ConditionTrue {
			t.Errorf("Stalled is True while the cluster is unreachable: %s", describe(cd))
		}
		if got := consecutiveFailures(t, reg, ns, "down"); got != 0 {
			t.Errorf("capstan_reconcile_consecutive_failures = %v while waiting for a cluster, want 0", got)
		}
		t.Logf("waiting: %s", stage(cd, "Remote").Message)

		writeKubeconfigSecret(t, c, ns, "down-kubeconfig", tg.kubeconfig)
		remote := func() bool { return object(t, tg.client, configMapGVK, ns, "remote-settings") != nil }
		waitFor(t, "the remote ConfigMap once the Secret is fixed", func() (bool, error) { return remote(), nil })
		cm := object(t, tg.client, configMapGVK, ns, "remote-settings")
		patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"`+remoteReadyAnnotation+`":"true"}}}`))
		if err := tg.client.Patch(context.Background(), cm, patch); err != nil {
			t.Fatal(err)
		}
		cd = waitDeployment(t, c, ns, "down", "Ready", isReady)
		if object(t, tg.client, configMapGVK, ns, "local-settings") == nil {
			t.Errorf("the deployment's kubeConfig did not take stage Local to the target: %s", describe(cd))
		}
		if got := consecutiveFailures(t, reg, ns, "down"); got != 0 {
			t.Errorf("capstan_reconcile_consecutive_failures = %v after recovering, want 0", got)
		}
		tg.assertNoToken(t, c, ns, "down")
	})

	t.Run("a cluster that comes back is used again with the same Secret", func(t *testing.T) {
		c := newClient(t)
		ns := newNamespace(t)
		url := newRemoteRepo(t, ns)
		addr := freeAddr(t)
		writeKubeconfigSecret(t, c, ns, "back-kubeconfig", tg.kubeconfigAt(t, addr))
		startDaemon(t, nil)
		createDeployment(t, c, ns, "back", remoteSpec(url, ns, gitSecret(t, c, ns), kubeconfigRef("back-kubeconfig")))
		waitDeployment(t, c, ns, "back", "stage Remote waiting for its cluster",
			stageWaits("Remote", "cluster of Secret "+ns+"/back-kubeconfig unreachable", "connection refused"))

		// The cluster answers at the address the Secret names: nothing
		// else changes, and the connection built while it was down works.
		tg.forward(t, addr)
		waitFor(t, "the remote ConfigMap once the cluster answers", func() (bool, error) {
			return object(t, tg.client, configMapGVK, ns, "remote-settings") != nil, nil
		})
		cm := object(t, tg.client, configMapGVK, ns, "remote-settings")
		patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"`+remoteReadyAnnotation+`":"true"}}}`))
		if err := tg.client.Patch(context.Background(), cm, patch); err != nil {
			t.Fatal(err)
		}
		waitDeployment(t, c, ns, "back", "Ready", isReady)
	})

	t.Run("a missing or malformed kubeconfig Secret is waited for and heals", func(t *testing.T) {
		c := newClient(t)
		ns := newNamespace(t)
		url := newRemoteRepo(t, ns)
		startDaemon(t, nil)
		createDeployment(t, c, ns, "later", remoteSpec(url, ns, gitSecret(t, c, ns), kubeconfigRef("later-kubeconfig")))

		cd := waitDeployment(t, c, ns, "later", "stage Remote waiting for its Secret",
			stageWaits("Remote", "Secret "+ns+"/later-kubeconfig", "does not exist"))
		t.Logf("waiting: %s", stage(cd, "Remote").Message)

		// A kubeconfig that does not parse, holding the token: named by
		// Secret and key, never quoted.
		writeKubeconfigSecret(t, c, ns, "later-kubeconfig", []byte("users: "+tg.token+"\n  : ["))
		cd = waitDeployment(t, c, ns, "later", "stage Remote waiting for a valid kubeconfig",
			stageWaits("Remote", "Secret "+ns+"/later-kubeconfig", "key value", "does not parse"))
		t.Logf("waiting: %s", stage(cd, "Remote").Message)
		if st := condition(cd, capstanv1.ConditionStalled); st != nil && st.Status == metav1.ConditionTrue {
			t.Errorf("Stalled is True while the kubeconfig is malformed: %s", describe(cd))
		}
		tg.assertNoToken(t, c, ns, "later")

		writeKubeconfigSecret(t, c, ns, "later-kubeconfig", tg.kubeconfig)
		waitFor(t, "the remote ConfigMap once the Secret is valid", func() (bool, error) {
			return object(t, tg.client, configMapGVK, ns, "remote-settings") != nil, nil
		})
		tg.assertNoToken(t, c, ns, "later")
	})

	t.Run("capstan diff compares each stage with its own cluster", func(t *testing.T) { diffAcrossClusters(t, tg) })
}

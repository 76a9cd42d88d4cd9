package reconciler

import (
	"context"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/event"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/stages"
)

// driftFixture is a drift watcher started on the package's control
// plane, with what it logs kept. Its "remote" clusters are the same API
// server reached through kubeconfig Secrets: what is judged is how the
// watcher connects, shares and stops, not the network.
type driftFixture struct {
	env        *testenv.Env
	cs         kubernetes.Interface
	ns         string
	kubeconfig []byte
	w          *driftWatcher
	wake       chan event.GenericEvent

	mu   sync.Mutex
	logs []string
}

func newDriftFixture(t *testing.T) *driftFixture {
	t.Helper()
	env := controlPlane(t)
	f := &driftFixture{env: env, wake: make(chan event.GenericEvent, 64)}
	var err error
	if f.cs, err = kubernetes.NewForConfig(env.Config); err != nil {
		t.Fatal(err)
	}
	if f.ns, err = env.CreateNamespace(t.Context(), t.Name()); err != nil {
		t.Fatal(err)
	}
	if f.kubeconfig, err = os.ReadFile(env.KubeconfigPath); err != nil {
		t.Fatal(err)
	}
	httpClient, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper, err := apiutil.NewDynamicRESTMapper(env.Config, httpClient)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := metadata.NewForConfigAndClient(env.Config, httpClient)
	if err != nil {
		t.Fatal(err)
	}
	logger := funcr.New(func(prefix, args string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.logs = append(f.logs, args)
	}, funcr.Options{})
	f.w = newDriftWatcher(logger, watchConn{name: stages.LocalClusterName, meta: meta, mapper: mapper}, f.cs.CoreV1().RESTClient(), Scheme(), f.wake)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.w.Start(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return f
}

// secret writes Secret name holding kubeconfig under key value.
func (f *driftFixture) secret(t *testing.T, name string, kubeconfig []byte) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}, Data: map[string][]byte{capstanv1.DefaultKubeConfigKey: kubeconfig}}
	_, err := f.cs.CoreV1().Secrets(f.ns).Update(t.Context(), s, metav1.UpdateOptions{})
	if err != nil {
		_, err = f.cs.CoreV1().Secrets(f.ns).Create(t.Context(), s, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// configMap creates a ConfigMap owned by deployment owner and returns its
// inventory ID.
func (f *driftFixture) configMap(t *testing.T, name, owner string) string {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: map[string]string{
		stages.OwnerNameLabel: owner, stages.OwnerNamespaceLabel: f.ns,
	}}}
	if _, err := f.cs.CoreV1().ConfigMaps(f.ns).Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return f.ns + "_" + name + "__ConfigMap"
}

func (f *driftFixture) deleteConfigMap(t *testing.T, name string) {
	t.Helper()
	if err := f.cs.CoreV1().ConfigMaps(f.ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// deployment is a Ready deployment whose inventory holds one stage per
// kubeconfig Secret in stages ("" for the cluster Capstan runs in), each
// with the objects of ids.
func (f *driftFixture) deployment(name string, stagesBySecret map[string][]string) *capstanv1.ClusterDeployment {
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}}
	cd.Status.Inventory = &capstanv1.Inventory{}
	for secret, ids := range stagesBySecret {
		s := capstanv1.InventoryStage{Name: "S" + secret}
		if secret != "" {
			s.KubeConfig, s.KubeConfigNamespace = &capstanv1.SecretKeyReference{Name: secret}, f.ns
		}
		for _, id := range ids {
			s.Entries = append(s.Entries, capstanv1.InventoryEntry{ID: id, Version: "v1"})
		}
		cd.Status.Inventory.Stages = append(cd.Status.Inventory.Stages, s)
	}
	return cd
}

func (f *driftFixture) ref(secret string) clusterKey {
	return clusterKey{namespace: f.ns, secret: secret, key: capstanv1.DefaultKubeConfigKey}
}

// remotes returns the cluster watches running, and the cluster each
// followed Secret reaches.
func (f *driftFixture) remotes() (map[string]*clusterWatch, map[clusterKey]string) {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	clusters := map[string]*clusterWatch{}
	for id, cw := range f.w.remotes {
		clusters[id] = cw
	}
	reaches := map[clusterKey]string{}
	for ref, kw := range f.w.kubeconfigs {
		reaches[ref] = kw.cluster
	}
	return clusters, reaches
}

// drifted waits until deployment name has drift noted and returns it.
func (f *driftFixture) drifted(t *testing.T, name string) map[driftKey]string {
	t.Helper()
	key := nn(f.ns, name)
	eventually(t, "drift noted for "+name, func() bool { return f.w.has(key) })
	return f.w.take(key)
}

func (f *driftFixture) logged(s string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.logs {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

func nn(ns, name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }

var configMapKind = schema.GroupKind{Kind: "ConfigMap"}

// eventually polls cond until it holds, failing the test after a minute.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitConfigMapsSynced waits until cw watches ConfigMaps and holds them
// all, so that what happens next reaches it as an event.
func waitConfigMapsSynced(t *testing.T, cw *clusterWatch) {
	t.Helper()
	eventually(t, "the ConfigMap kind watched and synced", func() bool {
		cw.mu.Lock()
		defer cw.mu.Unlock()
		kw := cw.kinds[configMapKind]
		if kw == nil {
			return false
		}
		_, ok := kw.storeOf()
		return ok
	})
}

// informerGoroutines counts the goroutines running client-go informers.
func informerGoroutines() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "k8s.io/client-go/tools/cache.") {
			n++
		}
	}
	return n
}

// withExtraCluster is kubeconfig with an unused cluster entry added: other
// content, same cluster.
func withExtraCluster(t *testing.T, kubeconfig []byte) []byte {
	t.Helper()
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		extra := *c
		cfg.Clusters["unused"] = &extra
		break
	}
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// unreachable is kubeconfig pointed at a loopback port nothing listens on.
func unreachable(t *testing.T, kubeconfig []byte) []byte {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	cfg, err := clientcmd.Load(kubeconfig)
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

// Deployments whose Secrets hold one kubeconfig share one cluster watch;
// a Secret that changes moves its deployments to the cluster it reaches
// now; the watches of a cluster no deployment needs stop, and with them
// every informer goroutine they started.
func TestDriftWatchesOfRemoteClustersAreSharedAndStop(t *testing.T) {
	f := newDriftFixture(t)
	before := informerGoroutines()
	f.secret(t, "a", f.kubeconfig)
	f.secret(t, "b", f.kubeconfig)
	one, two := f.configMap(t, "one", "d1"), f.configMap(t, "two", "d2")
	f.w.track(f.deployment("d1", map[string][]string{"a": {one}}))
	f.w.track(f.deployment("d2", map[string][]string{"b": {two}}))

	eventually(t, "both Secrets reaching one cluster watch", func() bool {
		clusters, reaches := f.remotes()
		return len(clusters) == 1 && reaches[f.ref("a")] != "" && reaches[f.ref("a")] == reaches[f.ref("b")]
	})
	clusters, _ := f.remotes()
	var shared *clusterWatch
	for _, cw := range clusters {
		shared = cw
	}
	waitConfigMapsSynced(t, shared)

	f.deleteConfigMap(t, "one")
	got := f.drifted(t, "d1")
	if want := (driftKey{ref: f.ref("a"), id: one}); len(got) != 1 || got[want] != "deleted" {
		t.Fatalf("drift of d1 = %v, want %v deleted", got, want)
	}
	if f.w.has(nn(f.ns, "d2")) {
		t.Errorf("d2 has drift noted: %v", f.w.take(nn(f.ns, "d2")))
	}

	// b changes: another kubeconfig, another cluster watch; a keeps the
	// first one.
	f.secret(t, "b", withExtraCluster(t, f.kubeconfig))
	eventually(t, "b reaching its own cluster watch", func() bool {
		clusters, reaches := f.remotes()
		return len(clusters) == 2 && reaches[f.ref("b")] != reaches[f.ref("a")] && reaches[f.ref("b")] != ""
	})
	running := informerGoroutines()
	if running <= before {
		t.Fatalf("%d informer goroutines with two cluster watches, %d before any", running, before)
	}
	f.deleteConfigMap(t, "two")
	got = f.drifted(t, "d2")
	if want := (driftKey{ref: f.ref("b"), id: two}); len(got) != 1 || got[want] != "deleted" {
		t.Fatalf("drift of d2 after b changed = %v, want %v deleted", got, want)
	}

	// a takes b's kubeconfig: the first cluster watch has no one left.
	f.secret(t, "a", withExtraCluster(t, f.kubeconfig))
	eventually(t, "a and b sharing b's cluster watch", func() bool {
		clusters, reaches := f.remotes()
		return len(clusters) == 1 && reaches[f.ref("a")] == reaches[f.ref("b")]
	})
	select {
	case <-shared.done:
	case <-time.After(time.Minute):
		t.Fatal("the cluster watch no Secret reaches did not stop")
	}

	f.w.forget(nn(f.ns, "d1"))
	f.w.forget(nn(f.ns, "d2"))
	clusters, reaches := f.remotes()
	if len(clusters) != 0 || len(reaches) != 0 {
		t.Fatalf("with no deployment left, %d cluster watches and %d Secret watches run", len(clusters), len(reaches))
	}
	eventually(t, "the informer goroutines gone", func() bool { return informerGoroutines() <= before })
	t.Logf("informer goroutines: %d before, %d with two cluster watches, %d after", before, running, informerGoroutines())
}

// A cluster that cannot be reached is retried in the background: the
// watches of the cluster Capstan runs in go on, the log says why (without
// the kubeconfig's token), and once the Secret reaches a cluster its
// objects are watched.
func TestDriftWatchOfUnreachableClusterDoesNotHoldUpTheOthers(t *testing.T) {
	f := newDriftFixture(t)
	f.secret(t, "down", unreachable(t, f.kubeconfig))
	local, remote := f.configMap(t, "local", "d"), f.configMap(t, "remote", "d")
	f.w.track(f.deployment("d", map[string][]string{"": {local}, "down": {remote}}))

	eventually(t, "the unreachable cluster logged", func() bool { return f.logged("drift watch cannot reach its cluster") })
	f.deleteConfigMap(t, "local")
	if got := f.drifted(t, "d"); len(got) != 1 || got[driftKey{ref: localRef, id: local}] != "deleted" {
		t.Fatalf("drift = %v, want the local ConfigMap deleted", got)
	}
	cfg, err := clientcmd.Load(f.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	for _, l := range f.logs {
		for _, user := range cfg.AuthInfos {
			if user.Token != "" && strings.Contains(l, user.Token) {
				t.Errorf("a log line holds the kubeconfig's token: %s", l)
			}
		}
	}
	f.mu.Unlock()

	_, reaches := f.remotes()
	unreached := reaches[f.ref("down")]
	if unreached == "" {
		t.Fatal("the unreachable cluster has no watch: it is not retried")
	}
	f.secret(t, "down", f.kubeconfig)
	eventually(t, "the Secret reaching the cluster it names now, alone", func() bool {
		clusters, reaches := f.remotes()
		return len(clusters) == 1 && reaches[f.ref("down")] != "" && reaches[f.ref("down")] != unreached
	})
	clusters, _ := f.remotes()
	for _, cw := range clusters {
		waitConfigMapsSynced(t, cw)
	}
	f.deleteConfigMap(t, "remote")
	if got := f.drifted(t, "d"); got[driftKey{ref: f.ref("down"), id: remote}] != "deleted" {
		t.Fatalf("drift = %v, want the remote ConfigMap deleted", got)
	}
}

// A data key Capstan applied, removed by an update whose writer is left
// owning no field (kubectl edit deleting the key), is drift: the watcher
// notes it, saying that no field manager is left to name, and the
// preflight's skip, which would find the object as Capstan's apply left
// it (no write by another manager after it), gets nothing to trust.
func TestDriftNotesAFieldRemovedByHand(t *testing.T) {
	f := newDriftFixture(t)
	ctx := t.Context()
	apply := corev1ac.ConfigMap("shrunk", f.ns).
		WithLabels(map[string]string{stages.OwnerNameLabel: "d", stages.OwnerNamespaceLabel: f.ns, stages.StageKey: "A"}).
		WithData(map[string]string{"k": "v", "x": "y"})
	if _, err := f.cs.CoreV1().ConfigMaps(f.ns).Apply(ctx, apply, metav1.ApplyOptions{FieldManager: stages.FieldManager, Force: true}); err != nil {
		t.Fatal(err)
	}
	id := f.ns + "_shrunk__ConfigMap"
	key := nn(f.ns, "d")
	f.w.track(f.deployment("d", map[string][]string{"": {id}}))
	waitConfigMapsSynced(t, f.w.home)
	if f.w.undrifted(key, id) == nil {
		t.Fatal("the watcher does not hold the ConfigMap as applied")
	}

	cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(ctx, "shrunk", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(cm.Data, "x")
	if _, err := f.cs.CoreV1().ConfigMaps(f.ns).Update(ctx, cm, metav1.UpdateOptions{FieldManager: "kubectl-edit"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "drift noted for d", func() bool { return f.w.has(key) })
	if live := f.w.undrifted(key, id); live != nil {
		t.Errorf("the preflight's skip is offered the shrunk ConfigMap (resourceVersion %s)", live.ResourceVersion)
	}
	meta, err := f.w.local.meta.Resource(corev1.SchemeGroupVersion.WithResource("configmaps")).Namespace(f.ns).Get(ctx, "shrunk", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range meta.ManagedFields {
		if mf.Manager == "kubectl-edit" {
			t.Fatalf("the API server kept an entry for the writer: %+v; the case under test is the one where none is left", mf)
		}
	}
	desired := &unstructured.Unstructured{}
	desired.SetLabels(map[string]string{stages.StageKey: "A"})
	if !leftByCapstan(meta, desired, stages.Owner{Name: "d", Namespace: f.ns}, "A") {
		t.Error("leftByCapstan rejects the shrunk ConfigMap: this test no longer shows that only the drift note keeps the skip away")
	}
	got := f.w.take(key)
	what := got[driftKey{ref: localRef, id: id}]
	for _, want := range []string{"a field Capstan manages (.data.x) was removed", "no field manager is left to name"} {
		if !strings.Contains(what, want) {
			t.Errorf("drift of the ConfigMap = %q, want it to say %q", what, want)
		}
	}
}

package sim

import (
	"bytes"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// testKubeconfigSecret: with Options.Kubeconfig the simulated KCP writes
// the Cluster's kubeconfig Secret as Cluster API v1.14 does (type
// cluster.x-k8s.io/secret, key value, the cluster-name label, controlled
// by the KubeadmControlPlane), with the bytes the caller gave, before the
// first machine; and writes it once, though it passes over the control
// plane many times.
func testKubeconfigSecret(t *testing.T, env *testenv.Env) {
	f := newSimFixture(t, env, nil)
	want := []byte("apiVersion: v1\nkind: Config\n# the workload cluster\n")
	var mu sync.Mutex
	var asked []types.NamespacedName
	opts := TestOptions("")
	opts.Kubeconfig = func(cluster types.NamespacedName) []byte {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, cluster)
		return want
	}
	_, events := f.startSimulator(opts)
	ctx := withDeadline(t, 2*time.Minute)
	f.waitFor(ctx, kindKubeadmControlPlane, "demo", "initialized", func(o *unstructured.Unstructured) bool {
		return flag(o.Object, "status", "initialization", "controlPlaneInitialized")
	})

	s := &corev1.Secret{}
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: "demo-kubeconfig"}, s); err != nil {
		t.Fatalf("the kubeconfig Secret: %v", err)
	}
	if s.Type != "cluster.x-k8s.io/secret" || !bytes.Equal(s.Data["value"], want) || len(s.Data) != 1 {
		t.Errorf("Secret demo-kubeconfig: type %q, keys %d, value %q; want cluster.x-k8s.io/secret with value = the caller's kubeconfig", s.Type, len(s.Data), s.Data["value"])
	}
	if s.Labels["cluster.x-k8s.io/cluster-name"] != "demo" {
		t.Errorf("Secret demo-kubeconfig labels %v, want cluster.x-k8s.io/cluster-name: demo", s.Labels)
	}
	kcp := f.get(kindKubeadmControlPlane, "demo")
	if refs := s.OwnerReferences; len(refs) != 1 || refs[0].Kind != "KubeadmControlPlane" || refs[0].UID != kcp.GetUID() || refs[0].Controller == nil || !*refs[0].Controller {
		t.Errorf("Secret demo-kubeconfig owners %+v, want the KubeadmControlPlane as controller", refs)
	}
	created, _ := strconv.ParseInt(s.ResourceVersion, 10, 64)
	firstMachine := firstRV(f.rec.history(), kindMachine.Kind, func(*unstructured.Unstructured) bool { return true })
	if created == 0 || firstMachine == 0 || created > firstMachine {
		t.Errorf("the kubeconfig Secret was written at revision %d, the first Machine at %d; KCP writes it first", created, firstMachine)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, c := range asked {
		if c != (types.NamespacedName{Namespace: f.ns, Name: "demo"}) {
			t.Errorf("Options.Kubeconfig asked for %s, want only the fixture's Cluster", c)
		}
	}
	if len(asked) != 1 {
		t.Errorf("Options.Kubeconfig called %d times, want once: the Secret is written once", len(asked))
	}
	if n := events.count("kubeconfig Secret demo-kubeconfig written for Cluster demo"); n != 1 {
		t.Errorf("%d events say the kubeconfig was written, want 1:\n%s", n, events)
	}
}

// Without Options.Kubeconfig no kubeconfig Secret is written.
func assertNoKubeconfig(t *testing.T, f *simFixture, cluster string) {
	t.Helper()
	err := f.c.Get(t.Context(), client.ObjectKey{Namespace: f.ns, Name: KubeconfigSecretName(cluster)}, &corev1.Secret{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("Secret %s: %v; want none without Options.Kubeconfig", KubeconfigSecretName(cluster), err)
	}
}

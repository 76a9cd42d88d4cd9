package reconciler

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// secrets answers Get for the Secrets it holds; the cache reads nothing
// else.
type secrets map[client.ObjectKey]*corev1.Secret

func (s secrets) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	secret, ok := s[key]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, key.Name)
	}
	secret.DeepCopyInto(obj.(*corev1.Secret))
	return nil
}

func (s secrets) List(context.Context, client.ObjectList, ...client.ListOption) error {
	panic("the cluster cache never lists")
}

const testToken = "t0ken-that-must-not-show"

func testKubeconfig(t *testing.T, server string) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: server}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: testToken}
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "x"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestClusterCacheKeysConnectionsBySecretVersion(t *testing.T) {
	ctx := t.Context()
	key := client.ObjectKey{Namespace: "ns", Name: "mgmt-kubeconfig"}
	store := secrets{}
	cache := newClusterCache(store, Scheme(), nil)
	cd := func(name string) *capstanv1.ClusterDeployment {
		return &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	}
	ref := clusterKey{namespace: "ns", secret: key.Name, key: capstanv1.DefaultKubeConfigKey}
	put := func(rv string, data map[string][]byte) {
		store[key] = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, ResourceVersion: rv}, Data: data}
	}

	_, err := cache.get(ctx, cd("a"), ref)
	if !stages.IsUnreachable(err) || !strings.Contains(err.Error(), "Secret ns/mgmt-kubeconfig") {
		t.Fatalf("missing Secret: err = %v, want unreachable naming the Secret", err)
	}

	put("1", map[string][]byte{"token": []byte(testToken)})
	_, err = cache.get(ctx, cd("a"), ref)
	if !stages.IsUnreachable(err) || !strings.Contains(err.Error(), "key value: not in the Secret (it has keys token)") {
		t.Fatalf("Secret without the key: err = %v, want unreachable naming the key", err)
	}
	if strings.Contains(err.Error(), testToken) {
		t.Fatalf("error %q holds a value of the Secret", err)
	}

	put("2", map[string][]byte{"value": testKubeconfig(t, "https://127.0.0.1:6443")})
	first, err := cache.get(ctx, cd("a"), ref)
	if err != nil {
		t.Fatal(err)
	}
	if first.Name() != "Secret ns/mgmt-kubeconfig" {
		t.Errorf("connection named %q", first.Name())
	}
	again, _ := cache.get(ctx, cd("b"), ref)
	if again != first {
		t.Error("the same Secret version gave a new connection")
	}

	put("3", map[string][]byte{"value": testKubeconfig(t, "https://127.0.0.1:7443")})
	changed, _ := cache.get(ctx, cd("a"), ref)
	if changed == first {
		t.Error("a changed Secret kept the old connection")
	}
	_, _ = cache.get(ctx, cd("b"), ref)

	cache.forget("ns", "a")
	if cache.len() != 1 {
		t.Errorf("after deployment a is gone, %d connections, want b's 1", cache.len())
	}
	cache.forget("ns", "b")
	if cache.len() != 0 {
		t.Errorf("after every user is gone, %d connections, want 0", cache.len())
	}
}

func TestKubeConfigForPrefersTheStage(t *testing.T) {
	deployment := &capstanv1.KubeConfigReference{SecretRef: &capstanv1.SecretKeyReference{Name: "whole"}}
	own := &capstanv1.KubeConfigReference{SecretRef: &capstanv1.SecretKeyReference{Name: "own"}}
	for _, tc := range []struct {
		name          string
		onCD, onStage *capstanv1.KubeConfigReference
		want          *capstanv1.KubeConfigReference
	}{
		{"neither: the cluster Capstan runs in", nil, nil, nil},
		{"the deployment's for every stage", deployment, nil, deployment},
		{"a stage's own overrides the deployment's", deployment, own, own},
		{"a stage's own alone", nil, own, own},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cd := &capstanv1.ClusterDeployment{Spec: capstanv1.ClusterDeploymentSpec{KubeConfig: tc.onCD}}
			stage := &stages.Stage{StageSpec: capstanv1.StageSpec{KubeConfig: tc.onStage}}
			if got := kubeConfigFor(cd, stage); got != tc.want {
				t.Errorf("kubeConfigFor = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPivotStageDefaultsToTheDeploymentsCluster(t *testing.T) {
	cd := &capstanv1.ClusterDeployment{}
	stage := &stages.Stage{StageSpec: capstanv1.StageSpec{Action: capstanv1.StageActionPivot}}
	got := kubeConfigFor(cd, stage)
	if got == nil || got.Cluster == nil || got.Cluster.Name != "" || got.SecretRef != nil {
		t.Fatalf("kubeConfigFor(pivot stage without one) = %+v, want cluster: {}", got)
	}
}

func TestResolveKubeConfig(t *testing.T) {
	cluster := func(ns, name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("cluster.x-k8s.io/v1beta2")
		u.SetKind("Cluster")
		u.SetNamespace(ns)
		u.SetName(name)
		return u
	}
	other := &unstructured.Unstructured{}
	other.SetAPIVersion("infrastructure.cluster.x-k8s.io/v1beta1")
	other.SetKind("Metal3Cluster") // a Cluster of another group is not one
	other.SetNamespace("metal3")
	other.SetName("mgmt")
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "capstan-system", Name: "mgmt"}}
	one := []*unstructured.Unstructured{other, cluster("metal3", "mgmt")}
	two := append(one, cluster("metal3", "spare"))

	for _, tc := range []struct {
		name    string
		ref     capstanv1.KubeConfigReference
		objects []*unstructured.Unstructured
		want    clusterKey
		err     string
	}{
		{"a Secret, in the deployment's namespace", capstanv1.KubeConfigReference{SecretRef: &capstanv1.SecretKeyReference{Name: "k"}}, nil,
			clusterKey{"capstan-system", "k", "value"}, ""},
		{"a Secret and its key", capstanv1.KubeConfigReference{SecretRef: &capstanv1.SecretKeyReference{Name: "k", Key: "config"}}, nil,
			clusterKey{"capstan-system", "k", "config"}, ""},
		{"the only Cluster: its Secret, in its namespace", capstanv1.KubeConfigReference{Cluster: &capstanv1.ClusterKubeConfigReference{}}, one,
			clusterKey{"metal3", "mgmt-kubeconfig", "value"}, ""},
		{"a Cluster by name among two", capstanv1.KubeConfigReference{Cluster: &capstanv1.ClusterKubeConfigReference{Name: "spare"}}, two,
			clusterKey{"metal3", "spare-kubeconfig", "value"}, ""},
		{"two Clusters and no name", capstanv1.KubeConfigReference{Cluster: &capstanv1.ClusterKubeConfigReference{}}, two,
			clusterKey{}, "applies 2 Clusters (metal3/mgmt, metal3/spare); set kubeConfig.cluster.name"},
		{"no Cluster", capstanv1.KubeConfigReference{Cluster: &capstanv1.ClusterKubeConfigReference{}}, []*unstructured.Unstructured{other},
			clusterKey{}, "applies no Cluster API Cluster whose kubeconfig Secret to use"},
		{"an unknown name", capstanv1.KubeConfigReference{Cluster: &capstanv1.ClusterKubeConfigReference{Name: "east"}}, one,
			clusterKey{}, `applies no Cluster API Cluster "east"`},
		{"both", capstanv1.KubeConfigReference{SecretRef: &capstanv1.SecretKeyReference{Name: "k"}, Cluster: &capstanv1.ClusterKubeConfigReference{}}, one,
			clusterKey{}, "not both"},
		{"neither", capstanv1.KubeConfigReference{}, one, clusterKey{}, "set secretRef"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolveKubeConfig(cd, &tc.ref, tc.objects)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !stages.IsStalled(err) {
					t.Fatalf("err = %v, want a stalled error containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("resolveKubeConfig = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

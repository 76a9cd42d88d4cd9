package reconciler

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/stages"
)

func deploymentIn(ns string) *capstanv1.ClusterDeployment {
	return &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "d"}}
}

// asServiceAccount makes every deployment act as ServiceAccount deployer.
func asServiceAccount(cd *capstanv1.ClusterDeployment) string {
	return serviceAccountUser(cd.Namespace, "deployer")
}

// TestKubeconfigNamespaces pins who may read a kubeconfig Secret of
// another namespace: the platform only (a deployment of Capstan's
// namespace; when that is unknown, one acting as Capstan itself).
func TestKubeconfigNamespaces(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rules   *kubeconfigRules
		cd, ns  string
		refused bool
	}{
		{"its own namespace", &kubeconfigRules{home: "capstan-system"}, "team-a", "team-a", false},
		{"a tenant, another namespace", &kubeconfigRules{home: "capstan-system"}, "team-a", "team-b", true},
		{"a tenant, Capstan's namespace", &kubeconfigRules{home: "capstan-system"}, "team-a", "capstan-system", true},
		{"the platform, another namespace", &kubeconfigRules{home: "capstan-system"}, "capstan-system", "central", false},
		{"the platform acting as a ServiceAccount", &kubeconfigRules{home: "capstan-system", actorOf: asServiceAccount}, "capstan-system", "central", false},
		{"no known home, acting as Capstan", &kubeconfigRules{}, "team-a", "team-b", false},
		{"no known home, acting as a ServiceAccount", &kubeconfigRules{actorOf: asServiceAccount}, "team-a", "team-b", true},
		{"no rules at all", nil, "team-a", "team-b", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.rules.namespaceAllowed(deploymentIn(tc.cd), tc.ns, "kubeconfig Secret "+tc.ns+"/prod-kubeconfig")
			if !tc.refused {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("allowed")
			}
			f, _ := failure.From(err)
			if !stages.IsStalled(err) || f.Reason != ReasonCrossNamespaceRefused || f.RetryAfter == 0 {
				t.Errorf("refusal %v: want stalled, reason %s, looked at again", err, ReasonCrossNamespaceRefused)
			}
			for _, want := range []string{"Secret " + tc.ns + "/prod-kubeconfig", "not the deployment's (" + tc.cd + ")"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("refusal %q does not say %q", err, want)
				}
			}
		})
	}
}

// TestInventoryKeyDoesNotTrustStatus: the namespace an inventory record
// names is taken only where the deployment may read; otherwise the
// record is refused, and nothing names the other namespace's Secret.
func TestInventoryKeyDoesNotTrustStatus(t *testing.T) {
	rules := &kubeconfigRules{home: "capstan-system"}
	record := func(ns string) capstanv1.InventoryStage {
		return capstanv1.InventoryStage{Name: "Remote", KubeConfig: &capstanv1.SecretKeyReference{Name: "prod-kubeconfig"}, KubeConfigNamespace: ns}
	}
	if key, err := inventoryKey(deploymentIn("team-a"), capstanv1.InventoryStage{Name: "Local"}, rules); err != nil || key != localRef {
		t.Errorf("a local stage: %v, %v", key, err)
	}
	if key, err := inventoryKey(deploymentIn("team-a"), record(""), rules); err != nil || key != (clusterKey{"team-a", "prod-kubeconfig", "value"}) {
		t.Errorf("a record without a namespace: %v, %v; want the deployment's", key, err)
	}
	_, err := inventoryKey(deploymentIn("team-a"), record("team-b"), rules)
	if err == nil || !stages.IsStalled(err) || !strings.Contains(err.Error(), "status.inventory stage Remote: kubeconfig Secret team-b/prod-kubeconfig") {
		t.Errorf("a tenant's record naming team-b: %v; want a stalled refusal naming it", err)
	}
	if key, err := inventoryKey(deploymentIn("capstan-system"), record("central"), rules); err != nil || key.namespace != "central" {
		t.Errorf("the platform's record naming central: %v, %v", key, err)
	}
}

// countingSecrets is secrets that counts the reads.
type countingSecrets struct {
	secrets
	gets []client.ObjectKey
}

func (c *countingSecrets) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets = append(c.gets, key)
	return c.secrets.Get(ctx, key, obj, opts...)
}

// TestClusterCacheRefusesBeforeReading: another namespace's Secret is not
// even read; a kubeconfig with a refused field is stalled (not waited
// for as a malformed one is), naming the Secret, key, entry and field.
func TestClusterCacheRefusesBeforeReading(t *testing.T) {
	ctx := t.Context()
	store := &countingSecrets{secrets: secrets{}}
	cache := newClusterCache(store, Scheme(), &kubeconfigRules{home: "capstan-system"})
	_, err := cache.get(ctx, deploymentIn("team-a"), clusterKey{"team-b", "prod-kubeconfig", "value"})
	if err == nil || !stages.IsStalled(err) || stages.IsUnreachable(err) {
		t.Fatalf("another namespace's Secret: %v; want a stalled refusal", err)
	}
	if len(store.gets) != 0 {
		t.Errorf("read %v for a refused namespace", store.gets)
	}

	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:6443"}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{Command: "/bin/sh", Args: []string{"-c", testToken},
		APIVersion: "client.authentication.k8s.io/v1", InteractiveMode: clientcmdapi.NeverExecInteractiveMode}}
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "admin"}
	cfg.CurrentContext = "x"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	store.secrets[client.ObjectKey{Namespace: "team-a", Name: "exec-kubeconfig"}] = &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "exec-kubeconfig", ResourceVersion: "1"}, Data: map[string][]byte{"value": data}}
	_, err = cache.get(ctx, deploymentIn("team-a"), clusterKey{"team-a", "exec-kubeconfig", "value"})
	f, _ := failure.From(err)
	if err == nil || !stages.IsStalled(err) || stages.IsUnreachable(err) || f.Reason != stages.ReasonKubeconfigRefused || f.RetryAfter == 0 {
		t.Fatalf("an exec kubeconfig: %v; want stalled, %s, looked at again", err, stages.ReasonKubeconfigRefused)
	}
	for _, want := range []string{"kubeconfig Secret team-a/exec-kubeconfig key value", `user "admin": field exec is refused`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), testToken) {
		t.Errorf("refusal %q quotes the kubeconfig", err)
	}
	cache.rules.policy.AllowExec = true
	if _, err := cache.get(ctx, deploymentIn("team-a"), clusterKey{"team-a", "exec-kubeconfig", "value"}); err != nil {
		t.Errorf("with --insecure-kubeconfig-exec: %v", err)
	}
}

// identified is a remote cluster whose identity is uid (or err).
type identified struct {
	stages.Cluster
	uid  string
	err  error
	asks int
}

func (i *identified) Name() string { return "Secret team-a/self-kubeconfig" }

func (i *identified) ClusterUID(context.Context) (string, error) {
	i.asks++
	return i.uid, i.err
}

// TestSameClusterRefusedToServiceAccounts: a kubeconfig that reaches the
// cluster Capstan runs in is refused to a deployment acting as a
// ServiceAccount, and only to it.
func TestSameClusterRefusedToServiceAccounts(t *testing.T) {
	home := func(context.Context) (string, error) { return "home-uid", nil }
	for _, tc := range []struct {
		name    string
		actorOf func(*capstanv1.ClusterDeployment) string
		there   *identified
		refused bool
	}{
		{"acting as a ServiceAccount, the same cluster", asServiceAccount, &identified{uid: "home-uid"}, true},
		{"acting as a ServiceAccount, another cluster", asServiceAccount, &identified{uid: "other-uid"}, false},
		{"acting as a ServiceAccount, a credential that may not tell", asServiceAccount, &identified{}, false},
		{"acting as Capstan, the same cluster", nil, &identified{uid: "home-uid"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules := &kubeconfigRules{actorOf: tc.actorOf, homeID: home}
			err := rules.sameClusterAllowed(t.Context(), deploymentIn("team-a"), tc.there)
			if !tc.refused {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !stages.IsStalled(err) || !strings.Contains(err.Error(), "reaches the cluster Capstan runs in") ||
				!strings.Contains(err.Error(), "ServiceAccount team-a/deployer") {
				t.Fatalf("err = %v; want a stalled refusal naming the ServiceAccount", err)
			}
		})
	}
	rules := &kubeconfigRules{actorOf: asServiceAccount, homeID: home}
	down := &identified{err: errors.New("boom")}
	if err := rules.sameClusterAllowed(t.Context(), deploymentIn("team-a"), down); err == nil {
		t.Error("a cluster that could not be identified was used")
	}
}

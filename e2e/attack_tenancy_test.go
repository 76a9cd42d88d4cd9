package e2e

import (
	"context"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/manifests"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/stages"
)

// serviceAccountConfig returns a config that authenticates as
// ServiceAccount ns/name with a token the API server issues for it (the
// TokenRequest API), as the kubelet gives a pod: the API server's RBAC,
// not an admin's, decides what its requests may do.
func serviceAccountConfig(t *testing.T, ns, name string) *rest.Config {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of ServiceAccount %s/%s: %v", ns, name, err)
	}
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tr.Status.Token
	return cfg
}

// clientAsUser returns a client that the API server treats as user (an
// admin's impersonation of the test's tenant).
func clientAsUser(t *testing.T, user string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// defaultServiceAccountOf returns the --default-service-account the
// rendered Deployment passes to the daemon, "" without one.
func defaultServiceAccountOf(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			args, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "args")
			for _, a := range args {
				if v, ok := strings.CutPrefix(a, "--default-service-account="); ok {
					return v
				}
			}
		}
	}
	return ""
}

// grantWrite lets ServiceAccount ns/sa (created first when create is set)
// manage ConfigMaps and Secrets in ns, and nothing else.
func grantWrite(t *testing.T, c client.Client, ns, sa string, create bool) {
	t.Helper()
	objs := []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: sa + "-write", Namespace: ns}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"configmaps", "secrets"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"},
		}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa + "-write", Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: sa + "-write"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}},
	}
	if create {
		objs = append([]client.Object{&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns}}}, objs...)
	}
	for _, o := range objs {
		if err := c.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTenancyInstallActsAsTheTenantsServiceAccount runs a daemon as the
// multi-tenant install runs it: authenticated as its ServiceAccount
// capstan (a real token), under the install's RBAC, with the
// --default-service-account its Deployment passes. A tenant, with only
// capstan-tenant in its namespace, creates a deployment that names no
// ServiceAccount: it is refused as capstan-deployer of the namespace,
// which has no permission yet, and nothing is applied. Naming a
// ServiceAccount of the namespace that may write ConfigMaps (admin, which
// the tenant did not make and was not given) is refused too: Capstan may
// impersonate capstan-deployer only. Once the platform grants
// capstan-deployer ConfigMaps and Secrets there, the deployment becomes
// Ready, acting as it, with Capstan reading the tenant's git Secret
// through capstan-namespace. In a namespace the platform did not bind to
// Capstan, nothing is read or applied.
func TestTenancyInstallActsAsTheTenantsServiceAccount(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	home, ns := newNamespace(t), newNamespace(t)
	objs, err := manifests.Objects(manifests.Options{Namespace: home, Tenancy: true})
	if err != nil {
		t.Fatal(err)
	}
	defaultSA := defaultServiceAccountOf(t, objs)
	if defaultSA != manifests.DefaultTenantServiceAccount {
		t.Fatalf("the multi-tenant install's Deployment passes --default-service-account=%q, want %q", defaultSA, manifests.DefaultTenantServiceAccount)
	}
	installRBAC(t, c, home, true)
	const user = "dev@tenant.example"
	onboardTenant(t, c, ns, home, user)
	// A ServiceAccount someone else put there, which may write what the
	// tenant's overlay holds.
	grantWrite(t, c, ns, "admin", true)
	rbacSynced(t, c, ns)

	url := pushOwned(t, ns, cm("mine", "A")+
		"apiVersion: v1\nkind: Secret\nmetadata: {name: token, namespace: '${NS}', labels: {capstan.dev/stage: A}}\nstringData: {token: t0p}\n---\n")
	asCapstan := serviceAccountConfig(t, home, "capstan")
	startDaemonWith(t, nil, func(o *reconciler.Options) {
		o.Config = asCapstan
		o.Reconciler.DefaultServiceAccount = defaultSA
		o.LeaderElection.Namespace = home
	})

	tenant := clientAsUser(t, user)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "git-auth", Namespace: ns},
		StringData: map[string]string{"username": "capstan", "password": "s3cret-token"}}
	if err := tenant.Create(ctx, secret); err != nil {
		t.Fatalf("the tenant creates its git Secret: %v", err)
	}
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns}, Spec: ownedSpec(url, ns, secret.Name, "A")}
	if err := tenant.Create(ctx, cd); err != nil {
		t.Fatalf("the tenant creates its ClusterDeployment: %v", err)
	}
	nothingApplied := func(ns, why string) {
		t.Helper()
		for _, gvk := range []schema.GroupVersionKind{configMapGVK, {Version: "v1", Kind: "Secret"}} {
			name := map[string]string{"ConfigMap": "mine", "Secret": "token"}[gvk.Kind]
			if object(t, c, gvk, ns, name) != nil {
				t.Errorf("%s: %s %s/%s was applied", why, gvk.Kind, ns, name)
			}
		}
	}

	deployer := "system:serviceaccount:" + ns + ":" + defaultSA
	got := waitDeployment(t, c, ns, "tenant", "stage A refused as "+deployer, func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "A").State == capstanv1.StageFailed && strings.Contains(stage(cd, "A").Message, deployer)
	})
	t.Logf("as the default ServiceAccount: %s", stage(got, "A").Message)
	nothingApplied(ns, "refused as "+deployer)

	// The tenant names a ServiceAccount of its namespace that may write
	// ConfigMaps: Capstan may not act as it.
	before := got.DeepCopy()
	got.Spec.ServiceAccountName = "admin"
	if err := tenant.Patch(ctx, got, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	got = waitDeployment(t, c, ns, "tenant", "stage A refused: Capstan may not act as "+ns+"/admin", func(cd *capstanv1.ClusterDeployment) bool {
		ready := condition(cd, capstanv1.ConditionReady)
		return isReady(cd) || ready != nil && ready.ObservedGeneration == cd.Generation && strings.Contains(describe(cd), "impersonate")
	})
	if isReady(got) {
		t.Fatalf("a deployment naming ServiceAccount %s/admin became Ready acting as it: the tenant acted as a ServiceAccount it was not given (%s)", ns, describe(got))
	}
	t.Logf("naming admin: %s", describe(got))
	nothingApplied(ns, "refused as "+ns+"/admin")

	// The tenant may not write what Capstan says of its deployment.
	got.Status.Conditions = nil
	if err := tenant.Status().Update(ctx, got); !apierrors.IsForbidden(err) {
		t.Errorf("the tenant updates its deployment's status: err %v, want Forbidden", err)
	}

	// The platform lets capstan-deployer of the namespace write ConfigMaps
	// and Secrets there; the tenant drops serviceAccountName.
	grantWrite(t, c, ns, defaultSA, false)
	before = got.DeepCopy()
	got.Spec.ServiceAccountName = ""
	if err := tenant.Patch(ctx, got, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	got = waitDeployment(t, c, ns, "tenant", "Ready as "+deployer, isReady)
	for gvk, name := range map[schema.GroupVersionKind]string{configMapGVK: "mine", {Version: "v1", Kind: "Secret"}: "token"} {
		if o := object(t, c, gvk, ns, name); o == nil || o.GetLabels()[stages.OwnerNameLabel] != "tenant" {
			t.Errorf("%s %s/%s not applied by the deployment: %v (%s)", gvk.Kind, ns, name, o, describe(got))
		}
	}

	// A namespace the platform did not bind to Capstan (someone else may
	// create ClusterDeployments there): Capstan reads none of its Secrets
	// and acts as none of its ServiceAccounts, says so, and applies
	// nothing.
	unbound := newNamespace(t)
	createDeployment(t, c, unbound, "stray", ownedSpec(url, unbound, gitSecret(t, c, unbound), "A"))
	capstanUser := "system:serviceaccount:" + home + ":capstan"
	stray := waitDeployment(t, c, unbound, "stray", "refused: Capstan is not bound in "+unbound, func(cd *capstanv1.ClusterDeployment) bool {
		return strings.Contains(describe(cd), capstanUser) && strings.Contains(describe(cd), "forbidden")
	})
	t.Logf("in a namespace not bound to Capstan: %s", describe(stray))
	nothingApplied(unbound, "a namespace not bound to Capstan")
}

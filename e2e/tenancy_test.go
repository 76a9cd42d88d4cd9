package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/stages"
)

// grantConfigMaps creates ServiceAccount sa in namespace ns and lets it
// manage ConfigMaps in each of namespaces, and nothing else.
func grantConfigMaps(t testing.TB, c client.Client, ns, sa string, namespaces ...string) {
	t.Helper()
	ctx := context.Background()
	objs := []client.Object{&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns}}}
	for _, target := range namespaces {
		objs = append(objs,
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: sa + "-configmaps", Namespace: target}, Rules: []rbacv1.PolicyRule{{
				APIGroups: []string{""}, Resources: []string{"configmaps"},
				Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"},
			}}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa + "-configmaps", Namespace: target},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: sa + "-configmaps"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}})
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDeploymentsActAsTheirServiceAccount: a deployment that names no
// ServiceAccount acts as the daemon's --default-service-account, whose
// RBAC allows ConfigMaps in its own namespace only: a ConfigMap of its
// overlay in another namespace is refused, naming the ServiceAccount,
// and nothing of the stage stays applied. Naming a ServiceAccount that
// may write there (spec.serviceAccountName) heals it, and its drift is
// corrected as that ServiceAccount.
func TestDeploymentsActAsTheirServiceAccount(t *testing.T) {
	c := newClient(t)
	ns, other := newNamespace(t), newNamespace(t)
	grantConfigMaps(t, c, ns, "deployer", ns)
	grantConfigMaps(t, c, ns, "wide", ns, other)
	url := pushOwned(t, ns, cm("mine", "A")+strings.ReplaceAll(cm("theirs", "A"), "'${NS}'", "'${OTHER}'"))
	startDaemonWith(t, nil, func(o *reconciler.Options) { o.Reconciler.DefaultServiceAccount = "deployer" })

	spec := ownedSpec(url, ns, gitSecret(t, c, ns), "A")
	spec.Substitute["OTHER"] = other
	createDeployment(t, c, ns, "tenant", spec)
	user := "system:serviceaccount:" + ns + ":deployer"
	cd := waitDeployment(t, c, ns, "tenant", "stage A refused as "+user, func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "A").State == capstanv1.StageFailed && strings.Contains(describe(cd), user)
	})
	t.Logf("as the default ServiceAccount: %s", stage(cd, "A").Message)
	for _, want := range []string{"ConfigMap/" + other + "/theirs", "forbidden", "docs/tenancy.md"} {
		if !strings.Contains(describe(cd), want) {
			t.Errorf("the deployment does not say %q: %s", want, describe(cd))
		}
	}
	if object(t, c, configMapGVK, other, "theirs") != nil || object(t, c, configMapGVK, ns, "mine") != nil {
		t.Error("the refused stage left objects applied")
	}

	// A merge patch: the daemon writes the status meanwhile.
	before := cd.DeepCopy()
	cd.Spec.ServiceAccountName = "wide"
	if err := c.Patch(context.Background(), cd, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	cd = waitDeployment(t, c, ns, "tenant", "Ready as "+ns+"/wide", isReady)
	for _, key := range []client.ObjectKey{{Namespace: ns, Name: "mine"}, {Namespace: other, Name: "theirs"}} {
		o := object(t, c, configMapGVK, key.Namespace, key.Name)
		if o == nil || o.GetLabels()[stages.OwnerNameLabel] != "tenant" {
			t.Errorf("ConfigMap %s not applied by ClusterDeployment tenant: %v (%s)", key, o, describe(cd))
		}
	}

	// Drift is corrected as the ServiceAccount too.
	theirs := object(t, c, configMapGVK, other, "theirs")
	if err := c.Delete(context.Background(), theirs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted ConfigMap restored as "+ns+"/wide", func() (bool, error) {
		return exists(t, c, configMapGVK, other, "theirs"), nil
	})
}

// TestTenantNamespaceDeletionDoesNotHang: deleting the namespace of a
// deployment that acts as its ServiceAccount takes the ServiceAccount's
// RoleBindings with it before the deployment's finalizer has deleted its
// objects. The finalizer must not wait for a permission that cannot come
// back: the namespace goes.
func TestTenantNamespaceDeletionDoesNotHang(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	grantConfigMaps(t, c, ns, "deployer", ns)
	url := pushOwned(t, ns, cm("mine", "A"))
	startDaemon(t, nil)
	spec := ownedSpec(url, ns, gitSecret(t, c, ns), "A")
	spec.ServiceAccountName = "deployer"
	createDeployment(t, c, ns, "tenant", spec)
	waitDeployment(t, c, ns, "tenant", "Ready", isReady)

	ctx := context.Background()
	if err := c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "namespace "+ns+" gone", func() (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		cd := &capstanv1.ClusterDeployment{}
		if c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tenant"}, cd) == nil {
			return false, fmt.Errorf("ClusterDeployment tenant still there: %s", describe(cd))
		}
		return false, err
	})
}

package incluster

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// tenantNS is the namespace of the tenant's deployment and ServiceAccount.
const tenantNS = "incluster-tenant"

// testActsAsItsServiceAccount checks that the shipped RBAC lets the
// daemon's pod act as a deployment's ServiceAccount (impersonate
// serviceaccounts): a deployment naming ServiceAccount deployer, which may
// write ConfigMaps in its own namespace only, applies the one there and
// is refused the one in the demo's namespace, naming the ServiceAccount.
func testActsAsItsServiceAccount(t *testing.T, c client.Client) {
	ctx := t.Context()
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenantNS}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "deployer", Namespace: tenantNS}},
		// A tenant reads its repository through a source of its own: the
		// root source serves only Capstan's namespace (docs/root-source.md).
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "git-auth", Namespace: tenantNS},
			StringData: map[string]string{"username": gitUser, "password": gitPassword}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "configmaps", Namespace: tenantNS}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "patch", "delete"},
		}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "deployer", Namespace: tenantNS},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "configmaps"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "deployer", Namespace: tenantNS}}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	configMap := func(ns, name string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: " + name + ", namespace: " + ns + ", labels: {capstan.dev/stage: Config}}\ndata: {owner: tenant}\n---\n"
	}
	files := map[string]string{
		"apps/tenant/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [config.yaml]\n",
		"apps/tenant/config.yaml":        configMap(tenantNS, "mine"),
	}
	if _, err := gitSrv.Commit(repoName, "main", files, "a tenant's overlay"); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: tenantNS, Name: "tenant"}
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}, Spec: capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: gitURL(), Ref: capstanv1.GitRef{Branch: "main"}, SecretRef: &capstanv1.LocalObjectReference{Name: "git-auth"},
		}},
		Path: "apps/tenant", ServiceAccountName: "deployer", Stages: []capstanv1.StageSpec{{Name: "Config"}},
		Interval: &metav1.Duration{Duration: 2 * time.Second},
	}}
	if err := c.Create(ctx, cd); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Delete(ctx, cd); client.IgnoreNotFound(err) != nil {
			t.Error(err)
		}
		waitFor(t, "ClusterDeployment tenant gone", func() (bool, string, error) {
			err := c.Get(ctx, key, &capstanv1.ClusterDeployment{})
			return err != nil, "still there", client.IgnoreNotFound(err)
		})
	}()
	condition := func(cd *capstanv1.ClusterDeployment) metav1.Condition {
		if c := metaCondition(cd.Status.Conditions, capstanv1.ConditionReady); c != nil {
			return *c
		}
		return metav1.Condition{}
	}
	waitFor(t, "ClusterDeployment tenant Ready as "+tenantNS+"/deployer", func() (bool, string, error) {
		if err := c.Get(ctx, key, cd); err != nil {
			return false, "", err
		}
		ready := condition(cd)
		return ready.Status == metav1.ConditionTrue && ready.ObservedGeneration == cd.Generation, ready.Reason + ": " + ready.Message, nil
	})
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: tenantNS, Name: "mine"}, &cm); err != nil {
		t.Fatalf("the tenant's ConfigMap: %v", err)
	}

	files["apps/tenant/config.yaml"] += configMap(appNS, "theirs")
	if _, err := gitSrv.Commit(repoName, "main", files, "a ConfigMap outside the tenant's namespace"); err != nil {
		t.Fatal(err)
	}
	user := "system:serviceaccount:" + tenantNS + ":deployer"
	waitFor(t, "stage Config refused as "+user, func() (bool, string, error) {
		if err := c.Get(ctx, key, cd); err != nil {
			return false, "", err
		}
		s := stage(cd, "Config")
		return s.State == capstanv1.StageFailed && strings.Contains(s.Message, user) && strings.Contains(s.Message, "ConfigMap/"+appNS+"/theirs"),
			string(s.State) + ": " + s.Message, nil
	})
	if err := c.Get(ctx, client.ObjectKey{Namespace: appNS, Name: "theirs"}, &corev1.ConfigMap{}); err == nil {
		t.Error("the ConfigMap the ServiceAccount may not write was applied")
	}
	t.Logf("refused: %s", stage(cd, "Config").Message)
}

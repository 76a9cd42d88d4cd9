package e2e

import (
	"context"
	"fmt"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/manifests"
)

// canISubject is who is asked about.
type canISubject struct {
	// label names the subject in the table.
	label string
	// user and groups are what the API server would authenticate.
	user   string
	groups []string
	// tenancyOnly: the subject exists only in the multi-tenant install.
	tenancyOnly bool
}

// serviceAccountSubject is the subject of ServiceAccount ns/name, with the groups
// its token carries.
func serviceAccountSubject(label, ns, name string, tenancyOnly bool) canISubject {
	return canISubject{label: label, user: "system:serviceaccount:" + ns + ":" + name,
		groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}, tenancyOnly: tenancyOnly}
}

// canIQuestion is one `kubectl auth can-i`.
type canIQuestion struct {
	verb, group, resource, subresource, ns, name string
	// deniedInTenancy: the multi-tenant install must refuse this, whatever
	// the golden file says (a golden file rewritten with -update cannot
	// bless it).
	deniedInTenancy bool
}

func (q canIQuestion) what() string {
	r := q.resource
	if q.group != "" {
		r += "." + q.group
	}
	if q.subresource != "" {
		r += "/" + q.subresource
	}
	return r
}

// canI asks the API server whether s may do q (a SubjectAccessReview).
func canI(ctx context.Context, c client.Client, s canISubject, q canIQuestion) (bool, error) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: s.user, Groups: s.groups,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: q.verb, Group: q.group, Resource: q.resource, Subresource: q.subresource, Namespace: q.ns, Name: q.name,
		},
	}}
	if err := c.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("can %s %s %s: %w", s.user, q.verb, q.what(), err)
	}
	return sar.Status.Allowed, nil
}

// The namespaces of the matrix as the table names them; the test maps
// them to the namespaces it creates.
const (
	homeNS  = "capstan-system" // where Capstan is installed
	teamA   = "team-a"         // a tenant's namespace, bound as docs/tenancy.md says
	teamB   = "team-b"         // another tenant's namespace, bound the same way
	anyNS   = ""               // every namespace (a cluster-wide list)
	kubeSys = "kube-system"    // a namespace nobody bound to Capstan
)

// tenantUser is the person of team-a, bound to capstan-tenant in team-a.
const tenantUser = "dev@team-a.example"

// canIRow is one subject and what is asked of it.
type canIRow struct {
	who canISubject
	q   []canIQuestion
}

// canIMatrix is the table docs/tenancy.md ("What a tenant can and cannot
// do") summarises, as RBAC answers it. ns maps the table's namespaces to
// the test's.
func canIMatrix(ns func(string) string) []canIRow {
	capstan := serviceAccountSubject("capstan (the daemon)", ns(homeNS), "capstan", false)
	tenant := canISubject{label: "tenant (capstan-tenant in team-a)", user: tenantUser, groups: []string{"system:authenticated"}, tenancyOnly: true}
	deployer := serviceAccountSubject("team-a/capstan-deployer", ns(teamA), manifests.DefaultTenantServiceAccount, false)
	platform := serviceAccountSubject("capstan-system/capstan-deployer", ns(homeNS), manifests.DefaultTenantServiceAccount, true)
	cds := func(verb, sub, n string, denied bool) canIQuestion {
		return canIQuestion{verb: verb, group: "capstan.dev", resource: "clusterdeployments", subresource: sub, ns: n, deniedInTenancy: denied}
	}
	core := func(verb, resource, n, name string, denied bool) canIQuestion {
		return canIQuestion{verb: verb, resource: resource, ns: n, name: name, deniedInTenancy: denied}
	}
	impersonate := func(n, name string, denied bool) canIQuestion {
		return canIQuestion{verb: "impersonate", resource: "serviceaccounts", ns: n, name: name, deniedInTenancy: denied}
	}
	rbac := func(verb, resource, n, name string) canIQuestion {
		return canIQuestion{verb: verb, group: "rbac.authorization.k8s.io", resource: resource, ns: n, name: name, deniedInTenancy: true}
	}
	token := canIQuestion{verb: "create", resource: "serviceaccounts", subresource: "token", ns: teamA, name: manifests.DefaultTenantServiceAccount, deniedInTenancy: true}
	rows := []canIRow{
		{capstan, []canIQuestion{
			cds("list", "", anyNS, false),
			cds("create", "", teamA, false),
			cds("update", "status", teamA, false),
			core("get", "secrets", teamA, "git-auth", false),
			core("watch", "secrets", teamA, "", false),
			core("create", "secrets", homeNS, "", false),
			core("get", "secrets", kubeSys, "", true),
			core("list", "secrets", anyNS, "", true),
			impersonate(teamA, manifests.DefaultTenantServiceAccount, false),
			impersonate(teamA, "admin", true),
			impersonate(homeNS, manifests.DefaultTenantServiceAccount, false),
			impersonate(homeNS, "capstan", true),
			impersonate(kubeSys, "clusterrole-aggregation-controller", true),
			{verb: "impersonate", resource: "users", name: "admin", deniedInTenancy: true},
			{verb: "impersonate", resource: "groups", name: "system:masters", deniedInTenancy: true},
			token,
			rbac("create", "clusterrolebindings", anyNS, ""),
			rbac("bind", "clusterroles", anyNS, "cluster-admin"),
			rbac("escalate", "clusterroles", anyNS, ""),
			core("create", "pods", teamA, "", true),
			{verb: "create", resource: "pods", subresource: "exec", ns: teamA, deniedInTenancy: true},
			{verb: "create", group: "apps", resource: "deployments", ns: kubeSys},
			{verb: "patch", group: "cluster.x-k8s.io", resource: "clusters", ns: teamA},
			core("list", "configmaps", anyNS, "", false),
			core("patch", "nodes", anyNS, "", false),
			{verb: "create", resource: "pods", subresource: "eviction", ns: teamA},
			{verb: "create", group: "coordination.k8s.io", resource: "leases", ns: teamA},
		}},
		{tenant, []canIQuestion{
			cds("create", "", teamA, false),
			cds("update", "", teamA, false),
			cds("delete", "", teamA, false),
			cds("update", "status", teamA, true),
			cds("patch", "status", teamA, true),
			cds("create", "", teamB, true),
			cds("create", "", homeNS, true),
			cds("list", "", anyNS, true),
			core("create", "secrets", teamA, "", false),
			core("get", "secrets", teamA, "", false),
			core("get", "secrets", teamB, "", true),
			core("get", "secrets", homeNS, "", true),
			core("list", "secrets", anyNS, "", true),
			impersonate(teamA, manifests.DefaultTenantServiceAccount, true),
			token,
			core("create", "serviceaccounts", teamA, "", true),
			rbac("create", "rolebindings", teamA, ""),
			core("create", "pods", teamA, "", true),
			core("create", "configmaps", teamA, "", true),
			{verb: "update", group: "coordination.k8s.io", resource: "leases", ns: teamA, deniedInTenancy: true},
			{verb: "update", group: "lcm.capstan.dev", resource: "lcmmachines", subresource: "status", ns: teamA, deniedInTenancy: true},
			core("list", "events", teamA, "", false),
		}},
		{deployer, []canIQuestion{
			core("create", "configmaps", teamA, "", true),
			core("get", "secrets", teamA, "", true),
			cds("update", "status", teamA, true),
			impersonate(teamA, "admin", true),
		}},
		{platform, []canIQuestion{
			{verb: "create", group: "cluster.x-k8s.io", resource: "clusters", ns: teamA},
			core("get", "secrets", teamB, "", false),
			cds("update", "status", homeNS, true),
			impersonate(teamA, manifests.DefaultTenantServiceAccount, true),
			rbac("create", "clusterrolebindings", anyNS, ""),
		}},
	}
	return rows
}

// onboardTenant binds namespace ns as docs/tenancy.md tells a platform
// admin to: the team's people to capstan-tenant, Capstan (ServiceAccount
// capstan of home) to capstan-namespace, and the ServiceAccount
// capstan-deployer, with no permission until the platform grants one.
func onboardTenant(t *testing.T, c client.Client, ns, home, user string) {
	t.Helper()
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: manifests.DefaultTenantServiceAccount, Namespace: ns}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "capstan-tenant", Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "capstan-tenant"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "capstan", Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "capstan-namespace"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "capstan", Namespace: home}}},
	}
	for _, o := range objs {
		if err := c.Create(context.Background(), o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

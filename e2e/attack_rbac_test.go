package e2e

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
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
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/manifests"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/stages"
)

// updateRBAC rewrites testdata/rbac/can-i.txt instead of comparing with it
// (go test ./e2e/ -run TestRBACCanIMatrix -update; CAPSTAN_UPDATE_GOLDEN=1
// does the same, as for the other golden files of this package).
var updateRBAC = flag.Bool("update", false, "rewrite the golden files of TestRBACCanIMatrix instead of comparing with them")

// installRBAC applies the RBAC objects of a Capstan install into the
// namespace home, as `capstan install` renders them (plain, or with
// --tenancy), and deletes them when the test ends. It returns once the
// API server's authorizer answers with them (rbacSynced).
func installRBAC(t *testing.T, c client.Client, home string, tenancy bool) {
	t.Helper()
	ctx := context.Background()
	objs, err := manifests.Objects(manifests.Options{Namespace: home, Tenancy: tenancy})
	if err != nil {
		t.Fatal(err)
	}
	var rbac []*unstructured.Unstructured
	for _, o := range objs {
		if leftoverKindsOfInstall[o.GetKind()] {
			rbac = append(rbac, o)
		}
	}
	if _, err := manifests.NewInstaller(c, nil).Apply(ctx, rbac); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, o := range rbac {
			if err := c.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
				t.Errorf("delete %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	})
	rbacSynced(t, c, home)
}

// leftoverKindsOfInstall are the kinds of an install's RBAC.
var leftoverKindsOfInstall = map[string]bool{
	"ServiceAccount": true, "ClusterRole": true, "ClusterRoleBinding": true, "Role": true, "RoleBinding": true,
}

// rbacSynced returns once the authorizer answers with every RBAC write
// made before: the aggregated ClusterRole capstan-apply holds the rules of
// the roles it selects (the aggregation controller writes them), then a
// probe of each RBAC kind, written last, is seen. The authorizer reads
// each kind from its own watch, in order, so a probe seen means every
// earlier write of its kind is seen too.
func rbacSynced(t *testing.T, c client.Client, ns string) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, "capstan-apply aggregates the roles labelled "+aggregateToApply, func() (bool, error) {
		var all rbacv1.ClusterRoleList
		if err := c.List(ctx, &all, client.MatchingLabels{aggregateToApply: "true"}); err != nil {
			return false, err
		}
		var want []rbacv1.PolicyRule
		for _, r := range all.Items {
			for _, rule := range r.Rules {
				if !slices.ContainsFunc(want, func(w rbacv1.PolicyRule) bool { return reflect.DeepEqual(w, rule) }) {
					want = append(want, rule)
				}
			}
		}
		var apply rbacv1.ClusterRole
		if err := c.Get(ctx, client.ObjectKey{Name: "capstan-apply"}, &apply); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if len(apply.Rules) != len(want) {
			return false, nil
		}
		for _, rule := range want {
			if !slices.ContainsFunc(apply.Rules, func(w rbacv1.PolicyRule) bool { return reflect.DeepEqual(w, rule) }) {
				return false, nil
			}
		}
		return true, nil
	})
	probe := fmt.Sprintf("capstan-e2e-probe-%d", time.Now().UnixNano())
	user := probe + "@example"
	rule := func(resource string) []rbacv1.PolicyRule {
		return []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{resource}, Verbs: []string{"get"}}}
	}
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	objs := []client.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: probe}, Rules: rule("limitranges")},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: probe}, Subjects: subjects,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: probe}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: probe, Namespace: ns}, Rules: rule("resourcequotas")},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: probe, Namespace: ns}, Subjects: subjects,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: probe}},
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, o := range objs {
			if err := c.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
				t.Errorf("delete probe %T: %v", o, err)
			}
		}
	}()
	waitFor(t, "the authorizer to see the RBAC probes", func() (bool, error) {
		for _, resource := range []string{"limitranges", "resourcequotas"} {
			ok, err := canI(ctx, c, subject{user: user}, question{verb: "get", resource: resource, ns: ns})
			if err != nil || !ok {
				return false, err
			}
		}
		return true, nil
	})
}

const aggregateToApply = "capstan.dev/aggregate-to-apply"

// subject is who is asked about.
type subject struct {
	// label names the subject in the table.
	label string
	// user and groups are what the API server would authenticate.
	user   string
	groups []string
	// tenancyOnly: the subject exists only in the multi-tenant install.
	tenancyOnly bool
}

// serviceAccount is the subject of ServiceAccount ns/name, with the groups
// its token carries.
func serviceAccount(label, ns, name string, tenancyOnly bool) subject {
	return subject{label: label, user: "system:serviceaccount:" + ns + ":" + name,
		groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}, tenancyOnly: tenancyOnly}
}

// question is one `kubectl auth can-i`.
type question struct {
	verb, group, resource, subresource, ns, name string
	// deniedInTenancy: the multi-tenant install must refuse this, whatever
	// the golden file says (a golden file rewritten with -update cannot
	// bless it).
	deniedInTenancy bool
}

func (q question) what() string {
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
func canI(ctx context.Context, c client.Client, s subject, q question) (bool, error) {
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

// matrixRow is one subject and what is asked of it.
type matrixRow struct {
	who subject
	q   []question
}

// canIMatrix is the table docs/tenancy.md ("What a tenant can and cannot
// do") summarises, as RBAC answers it. ns maps the table's namespaces to
// the test's.
func canIMatrix(ns func(string) string) []matrixRow {
	capstan := serviceAccount("capstan (the daemon)", ns(homeNS), "capstan", false)
	tenant := subject{label: "tenant (capstan-tenant in team-a)", user: tenantUser, groups: []string{"system:authenticated"}, tenancyOnly: true}
	deployer := serviceAccount("team-a/capstan-deployer", ns(teamA), manifests.DefaultTenantServiceAccount, false)
	platform := serviceAccount("capstan-system/capstan-deployer", ns(homeNS), manifests.DefaultTenantServiceAccount, true)
	cds := func(verb, sub, n string, denied bool) question {
		return question{verb: verb, group: "capstan.dev", resource: "clusterdeployments", subresource: sub, ns: n, deniedInTenancy: denied}
	}
	core := func(verb, resource, n, name string, denied bool) question {
		return question{verb: verb, resource: resource, ns: n, name: name, deniedInTenancy: denied}
	}
	impersonate := func(n, name string, denied bool) question {
		return question{verb: "impersonate", resource: "serviceaccounts", ns: n, name: name, deniedInTenancy: denied}
	}
	rbac := func(verb, resource, n, name string) question {
		return question{verb: verb, group: "rbac.authorization.k8s.io", resource: resource, ns: n, name: name, deniedInTenancy: true}
	}
	token := question{verb: "create", resource: "serviceaccounts", subresource: "token", ns: teamA, name: manifests.DefaultTenantServiceAccount, deniedInTenancy: true}
	rows := []matrixRow{
		{capstan, []question{
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
		{tenant, []question{
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
		{deployer, []question{
			core("create", "configmaps", teamA, "", true),
			core("get", "secrets", teamA, "", true),
			cds("update", "status", teamA, true),
			impersonate(teamA, "admin", true),
		}},
		{platform, []question{
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

// TestRBACCanIMatrix asks the API server (RBAC on) what Capstan's own
// ServiceAccount, a tenant bound to capstan-tenant, a tenant namespace's
// capstan-deployer and the platform's capstan-deployer may do, with the
// roles of manifests/ applied as `capstan install` renders them, plain
// and with --tenancy, and compares the table with
// testdata/rbac/can-i.txt. Rows the multi-tenant install must refuse fail
// the test on their own, whatever the golden file says.
func TestRBACCanIMatrix(t *testing.T) {
	c := newClient(t)
	ctx := context.Background()
	real := map[string]string{homeNS: newNamespace(t), teamA: newNamespace(t), teamB: newNamespace(t)}
	ns := func(n string) string {
		if r, ok := real[n]; ok {
			return r
		}
		return n
	}
	matrix := canIMatrix(ns)
	answers := map[bool]map[string]bool{}
	for _, tenancy := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "tenancy"}[tenancy], func(t *testing.T) {
			installRBAC(t, c, ns(homeNS), tenancy)
			onboardTenant(t, c, ns(teamA), ns(homeNS), tenantUser)
			onboardTenant(t, c, ns(teamB), ns(homeNS), "dev@team-b.example")
			rbacSynced(t, c, ns(homeNS)) // the bindings of onboardTenant
			got := map[string]bool{}
			for _, row := range matrix {
				if row.who.tenancyOnly && !tenancy {
					continue
				}
				for _, q := range row.q {
					asked := q
					asked.ns = ns(q.ns)
					ok, err := canI(ctx, c, row.who, asked)
					if err != nil {
						t.Fatal(err)
					}
					got[row.who.label+"|"+key(q)] = ok
					if tenancy && ok && q.deniedInTenancy {
						t.Errorf("multi-tenant install: %s may %s %s in namespace %q (name %q); it must not", row.who.label, q.verb, q.what(), q.ns, q.name)
					}
				}
			}
			answers[tenancy] = got
		})
	}
	if len(answers) != 2 {
		return
	}
	golden(t, filepath.Join("testdata", "rbac", "can-i.txt"), renderMatrix(matrix, answers))
}

func key(q question) string {
	return strings.Join([]string{q.verb, q.what(), q.ns, q.name}, "|")
}

// renderMatrix writes the table: one line per question, its answer in the
// plain and the multi-tenant install ("-" where the subject does not
// exist).
func renderMatrix(matrix []matrixRow, answers map[bool]map[string]bool) string {
	var buf bytes.Buffer
	buf.WriteString(`# kubectl auth can-i, as the API server answers it (SubjectAccessReview) with
# the RBAC of manifests/ applied as capstan install renders it: plain, and
# with --tenancy (manifests/components/tenancy). Tenant namespaces are bound
# as docs/tenancy.md says (capstan-tenant to their people, capstan-namespace
# to Capstan). Written by TestRBACCanIMatrix (e2e/attack_rbac_test.go):
#   go test ./e2e/ -run TestRBACCanIMatrix -update
`)
	w := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "subject\tverb\tresource\tnamespace\tname\tplain\ttenancy")
	yesNo := func(tenancy bool, who subject, q question) string {
		if who.tenancyOnly && !tenancy {
			return "-"
		}
		if answers[tenancy][who.label+"|"+key(q)] {
			return "yes"
		}
		return "no"
	}
	for _, row := range matrix {
		for _, q := range row.q {
			ns := q.ns
			if ns == anyNS {
				ns = "*"
			}
			name := q.name
			if name == "" {
				name = "*"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", row.who.label, q.verb, q.what(), ns, name,
				yesNo(false, row.who, q), yesNo(true, row.who, q))
		}
	}
	w.Flush()
	return buf.String()
}

// golden compares got with the file at path, or writes it with -update.
func golden(t *testing.T, path, got string) {
	t.Helper()
	if *updateRBAC || os.Getenv("CAPSTAN_UPDATE_GOLDEN") != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs (go test ./e2e/ -run %s -update rewrites it):\n%s", path, t.Name(), lineDiff(string(want), got))
	}
}

// lineDiff lists the lines of want missing from got (-) and those of got
// missing from want (+).
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for _, l := range w {
		if !slices.Contains(g, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

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

// actingAs returns a client that the API server treats as user (an
// admin's impersonation of the test's tenant).
func actingAs(t *testing.T, user string) client.Client {
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
// through capstan-namespace.
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

	tenant := actingAs(t, user)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "git-auth", Namespace: ns},
		StringData: map[string]string{"username": "capstan", "password": "s3cret-token"}}
	if err := tenant.Create(ctx, secret); err != nil {
		t.Fatalf("the tenant creates its git Secret: %v", err)
	}
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns}, Spec: ownedSpec(url, ns, secret.Name, "A")}
	if err := tenant.Create(ctx, cd); err != nil {
		t.Fatalf("the tenant creates its ClusterDeployment: %v", err)
	}
	nothingApplied := func(why string) {
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
	nothingApplied("refused as " + deployer)

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
	nothingApplied("refused as " + ns + "/admin")

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
}

// seriesOf lists the capstan_* series of reg whose labels include want, as
// "family{labels}".
func seriesOf(t *testing.T, reg *prometheus.Registry, want map[string]string) []string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "capstan_") {
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
			out = append(out, fmt.Sprintf("%s%v", f.GetName(), labels))
		}
	}
	return out
}

// TestDeletedDeploymentLeavesNoMetricSeries: a deployment's series, and
// the stage-duration histogram of a stage name only it used, go when the
// stage leaves its plan and when the deployment is deleted, in the
// registry the daemon serves.
func TestDeletedDeploymentLeavesNoMetricSeries(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url := pushOwned(t, ns, cm("first", "A")+cm("second", "OnlyHere"))
	reg := prometheus.NewRegistry()
	startDaemonWith(t, nil, func(o *reconciler.Options) { o.MetricsRegistry = reg })
	createDeployment(t, c, ns, "counted", ownedSpec(url, ns, gitSecret(t, c, ns), "A", "OnlyHere"))
	cd := waitDeployment(t, c, ns, "counted", "Ready", isReady)
	mine := map[string]string{"namespace": ns, "cluster": "counted"}
	onlyHere := map[string]string{"stage": "OnlyHere"}
	if len(seriesOf(t, reg, mine)) == 0 || len(seriesOf(t, reg, onlyHere)) == 0 {
		t.Fatalf("a Ready deployment with stage OnlyHere exports %v and %v", seriesOf(t, reg, mine), seriesOf(t, reg, onlyHere))
	}

	// Stage OnlyHere leaves the plan, and its ConfigMap the overlay.
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, ownedRepo(cm("first", "A")), "v2"); err != nil {
		t.Fatal(err)
	}
	before := cd.DeepCopy()
	cd.Spec.Stages = cd.Spec.Stages[:1]
	if err := c.Patch(context.Background(), cd, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the series of stage OnlyHere gone", func() (bool, error) {
		return len(seriesOf(t, reg, onlyHere)) == 0, nil
	})

	if err := c.Delete(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every series of ClusterDeployment "+ns+"/counted gone", func() (bool, error) {
		left := seriesOf(t, reg, mine)
		return len(left) == 0 && len(seriesOf(t, reg, map[string]string{"stage": "A"})) == 0, nil
	})
}

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

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/manifests"
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
		if installRBACKinds[o.GetKind()] {
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

// installRBACKinds are the kinds of an install's RBAC.
var installRBACKinds = map[string]bool{
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
			ok, err := canI(ctx, c, canISubject{user: user}, canIQuestion{verb: "get", resource: resource, ns: ns})
			if err != nil || !ok {
				return false, err
			}
		}
		return true, nil
	})
}

const aggregateToApply = "capstan.dev/aggregate-to-apply"

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
					got[row.who.label+"|"+questionKey(q)] = ok
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
	compareGoldenFile(t, filepath.Join("testdata", "rbac", "can-i.txt"), renderMatrix(matrix, answers))
}

func questionKey(q canIQuestion) string {
	return strings.Join([]string{q.verb, q.what(), q.ns, q.name}, "|")
}

// renderMatrix writes the table: one line per question, its answer in the
// plain and the multi-tenant install ("-" where the subject does not
// exist).
func renderMatrix(matrix []canIRow, answers map[bool]map[string]bool) string {
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
	yesNo := func(tenancy bool, who canISubject, q canIQuestion) string {
		if who.tenancyOnly && !tenancy {
			return "-"
		}
		if answers[tenancy][who.label+"|"+questionKey(q)] {
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

// compareGoldenFile compares got with the file at path, or writes it with -update.
func compareGoldenFile(t *testing.T, path, got string) {
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
		t.Errorf("%s differs (go test ./e2e/ -run %s -update rewrites it):\n%s", path, t.Name(), goldenLineDiff(string(want), got))
	}
}

// goldenLineDiff lists the lines of want missing from got (-) and those of got
// missing from want (+).
func goldenLineDiff(want, got string) string {
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

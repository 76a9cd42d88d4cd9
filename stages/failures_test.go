package stages_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/stages"
)

// An API error that can never succeed stalls the stage at once, with the
// server's own words and a reason that says which, instead of being
// retried forever: an object over the request size limit, a kind the
// executor's identity may not write.
func TestRunStallsOnWhatTheServerNeverTakes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		executor   func(t *testing.T, ns string) *stages.Executor
		object     func(ns string) *unstructured.Unstructured
		wantReason string
		wantErr    []string
	}{
		{
			name:     "object over the request size limit",
			executor: func(t *testing.T, _ string) *stages.Executor { c, _ := newClient(t); return stages.NewExecutor(c) },
			object: func(ns string) *unstructured.Unstructured {
				return configMap(ns, "huge", map[string]any{"blob": strings.Repeat("x", 4<<20)})
			},
			wantReason: stages.ReasonObjectTooLarge,
			wantErr:    []string{"ConfigMap/%s/huge", "Request entity too large", "split the object"},
		},
		{
			name:     "a kind the identity may not write",
			executor: readOnlyExecutor,
			object: func(ns string) *unstructured.Unstructured {
				return configMap(ns, "denied", map[string]any{"a": "b"})
			},
			wantReason: stages.ReasonForbidden,
			wantErr:    []string{"ConfigMap/%s/denied", `User "capstan-read-only" cannot patch resource "configmaps"`, stages.AggregateToApplyLabel},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			e := tc.executor(t, ns)
			stage := &stages.Stage{
				StageSpec: capstanv1.StageSpec{Name: "Config", Action: capstanv1.StageActionApply},
				Objects:   []*unstructured.Unstructured{tc.object(ns)},
			}
			res := e.Run(testContext(t), stage, owner, stages.RunOptions{Wait: 5 * time.Second})
			if res.State != capstanv1.StageFailed || !stages.IsStalled(res.Err) {
				t.Fatalf("Run = %s (err %v), want a stalled failure", res.State, res.Err)
			}
			if got := failure.ReasonOf(res.Err, ""); got != tc.wantReason {
				t.Errorf("reason %q, want %q", got, tc.wantReason)
			}
			for _, want := range tc.wantErr {
				if want = strings.ReplaceAll(want, "%s", ns); !strings.Contains(res.Err.Error(), want) {
					t.Errorf("error does not say %q:\n%v", want, res.Err)
				}
			}
		})
	}
}

// readOnlyExecutor is an executor acting as a user that may read
// ConfigMaps in ns and write nothing, by impersonation.
func readOnlyExecutor(t *testing.T, ns string) *stages.Executor {
	t.Helper()
	admin, _ := newClient(t)
	ctx := testContext(t)
	const user = "capstan-read-only"
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "read-configmaps", Namespace: ns},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "read-configmaps", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := client.NewWithWatch(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return stages.NewExecutor(c)
}

// A readiness expression that costs more than the CEL cost limit on the
// live object can never be judged: the stage stalls saying so, rather than
// waiting forever with the evaluation's error as what it waits for.
func TestRunStallsOnAReadinessCheckOverTheCostLimit(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	data := map[string]any{}
	for i := range 1500 {
		data[fmt.Sprintf("k%04d", i)] = "v"
	}
	const expr = "object.data.all(a, object.data.all(b, a != b || a == b))"
	stage := &stages.Stage{
		StageSpec: capstanv1.StageSpec{Name: "Config", Action: capstanv1.StageActionApply,
			ReadyWhen: []capstanv1.ReadinessCheck{{Kind: "ConfigMap", CEL: expr}}},
		Objects: []*unstructured.Unstructured{configMap(ns, "wide", data)},
	}
	ctx, cancel := context.WithTimeout(testContext(t), 20*time.Second)
	defer cancel()
	res := e.Run(ctx, stage, owner, stages.RunOptions{})
	if res.State != capstanv1.StageFailed || !stages.IsStalled(res.Err) {
		t.Fatalf("Run = %s (err %v, message %q), want a stalled failure", res.State, res.Err, res.Message)
	}
	if got := failure.ReasonOf(res.Err, ""); got != stages.ReasonReadinessCheckFailed {
		t.Errorf("reason %q, want %q", got, stages.ReasonReadinessCheckFailed)
	}
	for _, want := range []string{expr, "ConfigMap/" + ns + "/wide", "cost limit"} {
		if !strings.Contains(res.Err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, res.Err)
		}
	}
}

// A permission Capstan's identity lacks is not a fault of the source:
// preflight warns about it and lets the stage run, where the apply fails
// naming the permission and is tried again until someone grants it (the
// same revision heals). Refusing the revision in preflight would hold it
// until a new commit.
func TestPreflightWarnsOfAPermissionItLacks(t *testing.T) {
	ns := newNamespace(t)
	e := readOnlyExecutor(t, ns)
	plan, err := stages.BuildPlan(preflightStages, []*unstructured.Unstructured{configMap(ns, "denied", map[string]any{"a": "b"})})
	if err != nil {
		t.Fatal(err)
	}
	report, err := e.Preflight(testContext(t), plan, owner, stages.PreflightOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if errs := report.Errors(); len(errs) != 0 {
		t.Errorf("preflight refuses the revision for a permission:\n%s", report.Lines())
	}
	if w := report.Warnings(); len(w) != 1 || !strings.Contains(w[0].Message, `cannot patch resource "configmaps"`) {
		t.Errorf("want one warning naming the permission, got:\n%s", report.Lines())
	}
}

package stages_test

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/stages"
)

// installGizmos installs the Gizmo CRD of testdata/served: v1beta2
// served, v1beta1 served but deprecated, v1alpha1 no longer served.
func installGizmos(t *testing.T) {
	t.Helper()
	if err := testenv.InstallCRDs(testContext(t), env.Config, "testdata/served/gizmos.yaml"); err != nil {
		t.Fatal(err)
	}
}

// servedPlan is a capm3-like plan: a Preflight whose select holds only the
// network objects, then stages that apply the rest.
func servedPlan(t *testing.T, ns, stream string) *stages.Plan {
	t.Helper()
	objects := decodeObjects(t, strings.ReplaceAll(stream, "NS", ns))
	plan, err := stages.BuildPlan([]capstanv1.StageSpec{
		{Name: "Preflight", Action: capstanv1.StageActionValidate, Select: capstanv1.Selector{Kinds: []string{"ConfigMap"}}},
		{Name: "Config", Select: capstanv1.Selector{Kinds: []string{"ConfigMap"}}},
		{Name: "Definitions", Select: capstanv1.Selector{Kinds: []string{"CustomResourceDefinition"}}},
		{Name: "Gizmos", Select: capstanv1.Selector{Kinds: []string{"*"}}},
	}, objects)
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

// walk runs a plan's stages as the reconciler does, one after the other,
// and stops at the first that is not Ready.
func walk(ctx context.Context, e *stages.Executor, plan *stages.Plan) []stages.Result {
	var results []stages.Result
	for i := range plan.Stages {
		res := e.Run(ctx, &plan.Stages[i], owner, stages.RunOptions{})
		results = append(results, res)
		if res.State != capstanv1.StageReady {
			break
		}
	}
	return results
}

// A plan that holds a kind the cluster does not serve, in a stage after
// others, applies nothing at all: the Preflight stage stalls with every
// problem before the first apply stage runs.
func TestPreflightServedStopsThePlanBeforeAnyApply(t *testing.T) {
	ns := newNamespace(t)
	installGizmos(t)
	ctx := testContext(t)
	c, log := newClient(t)
	plan := servedPlan(t, ns, `apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: NS}
---
apiVersion: served.test.capstan.dev/v1beta2
kind: Gizmo
metadata: {name: current, namespace: NS}
---
apiVersion: served.test.capstan.dev/v1alpha1
kind: Gizmo
metadata:
  name: ancient
  namespace: NS
  annotations:
    config.kubernetes.io/origin: |
      path: base/gizmo.yaml
---
apiVersion: served.test.capstan.dev/v1beta1
kind: Gizmo
metadata: {name: deprecated, namespace: NS}
---
apiVersion: missing.test.capstan.dev/v1
kind: Sprocket
metadata: {name: nowhere, namespace: NS}`)

	mark := log.mark()
	results := walk(ctx, stages.NewExecutor(c), plan)
	if len(results) != 1 {
		t.Fatalf("the walk ran %d stages, want it to stop at Preflight: %+v", len(results), results)
	}
	res := results[0]
	if res.State != capstanv1.StageFailed || !stages.IsStalled(res.Err) || res.Applied {
		t.Fatalf("Preflight = %s (stalled %v, applied %v): %v; want a stalled failure", res.State, stages.IsStalled(res.Err), res.Applied, res.Err)
	}
	want := []string{
		"preflight found 2 errors, 1 warning:",
		"ERROR Gizmo " + ns + "/ancient: apiVersion: Gizmo is served as served.test.capstan.dev/v1beta2, v1beta1; not v1alpha1; write the object in served.test.capstan.dev/v1beta2 (in base/gizmo.yaml)",
		"WARNING Gizmo " + ns + "/deprecated: apiVersion: served.test.capstan.dev/v1beta1 is deprecated (served.test.capstan.dev/v1beta1 Gizmo is deprecated; use served.test.capstan.dev/v1beta2); write the object in served.test.capstan.dev/v1beta2",
		"ERROR Sprocket " + ns + "/nowhere: kind: the cluster serves no Sprocket in group missing.test.capstan.dev: no CustomResourceDefinition in the cluster or earlier in this plan defines it; install the provider first",
	}
	if got := strings.Split(res.Message, "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Preflight says\n%s\nwant\n%s", res.Message, strings.Join(want, "\n"))
	}
	if !strings.Contains(res.Err.Error(), "stage Preflight: preflight found 2 errors, 1 warning") || strings.Contains(res.Err.Error(), "WARNING") {
		t.Errorf("err = %v, want the stage and the errors, not the warning", res.Err)
	}
	if writes := log.writesSince(mark, true); len(writes) > 0 {
		t.Errorf("the walk sent writes, dry runs included: %v", writes)
	}
	for _, obj := range plan.Stages[0].PlanObjects {
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(obj.GroupVersionKind())
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), live); !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
			t.Errorf("get %s = %v, want it not found: nothing of any stage is applied", stages.ObjectRef(obj), err)
		}
	}
}

// A deprecated version only warns, and a kind the plan's own CRD defines
// is served once that CRD is applied: the whole plan applies.
func TestPreflightServedPassesDeprecatedAndPlannedKinds(t *testing.T) {
	ns := newNamespace(t)
	installGizmos(t)
	ctx := testContext(t)
	c, _ := newClient(t)
	t.Cleanup(func() {
		crd := &unstructured.Unstructured{}
		crd.SetAPIVersion("apiextensions.k8s.io/v1")
		crd.SetKind("CustomResourceDefinition")
		crd.SetName("doohickeys.served.test.capstan.dev")
		_ = client.IgnoreNotFound(c.Delete(context.Background(), crd))
	})
	plan := servedPlan(t, ns, `apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: NS}
---
apiVersion: served.test.capstan.dev/v1beta1
kind: Gizmo
metadata: {name: deprecated, namespace: NS}
spec: {size: 1}
---
apiVersion: served.test.capstan.dev/v1
kind: Doohickey
metadata: {name: planned, namespace: NS}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: doohickeys.served.test.capstan.dev}
spec:
  group: served.test.capstan.dev
  names: {kind: Doohickey, listKind: DoohickeyList, plural: doohickeys, singular: doohickey}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}`)

	e := stages.NewExecutor(c)
	first := e.ApplyStage(ctx, &plan.Stages[0], owner)
	wantMessage := "preflight passed with 0 errors, 1 warning:\nWARNING Gizmo " + ns + "/deprecated: apiVersion: served.test.capstan.dev/v1beta1 is deprecated"
	if first.State != capstanv1.StageInProgress || !strings.HasPrefix(first.Message, wantMessage) {
		t.Errorf("Preflight = %s: %q, want it to pass with the warning %q", first.State, first.Message, wantMessage)
	}
	results := walk(ctx, e, plan)
	for _, res := range results {
		if res.State != capstanv1.StageReady {
			t.Fatalf("stage %s = %s: %s", res.Stage, res.State, res.Message)
		}
	}
	if len(results) != len(plan.Stages) {
		t.Fatalf("%d stages ran, want all %d", len(results), len(plan.Stages))
	}
	for _, obj := range plan.Stages[3].Objects {
		getLive(t, c, obj)
	}
}

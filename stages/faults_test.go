package stages_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxcd/pkg/ssa"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// The tests in this file put a fault between the executor and the real API
// server, to reach the paths a healthy control plane does not take.

// failingApply refuses the apply (not the dry run) of one object.
type failingApply struct {
	client.WithWatch
	name string
}

var errInjected = errors.New("injected failure")

func (f failingApply) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	po := (&client.PatchOptions{}).ApplyOptions(opts)
	if len(po.DryRun) == 0 && obj.GetName() == f.name {
		return errInjected
	}
	return f.WithWatch.Patch(ctx, obj, patch, opts...)
}

// TestApplyChangeSetLeavesOutFailedApplies: an object whose dry run passed
// but whose apply failed was not created; the change set must not say it
// was.
func TestApplyChangeSetLeavesOutFailedApplies(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(failingApply{WithWatch: c, name: "refused"})
	objs := []*unstructured.Unstructured{
		configMap(ns, "accepted", map[string]any{"k": "v"}),
		configMap(ns, "refused", map[string]any{"k": "v"}),
	}

	cs, err := e.Apply(testContext(t), objs, "Config", owner)
	if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "ConfigMap/"+ns+"/refused") {
		t.Errorf("error = %v, want the injected failure naming ConfigMap/%s/refused", err, ns)
	}
	if stages.IsStalled(err) {
		t.Errorf("a failed apply is stalled; retrying may well help: %v", err)
	}
	want := map[string]ssa.Action{"ConfigMap/" + ns + "/accepted": ssa.CreatedAction}
	if got := actions(cs); !maps.Equal(got, want) {
		t.Errorf("change set = %v, want %v", got, want)
	}
}

// failingWatch lists through the real client but cannot watch, and counts
// the lists.
type failingWatch struct {
	client.WithWatch
	lists *atomic.Int64
}

func (f failingWatch) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	f.lists.Add(1)
	return f.WithWatch.List(ctx, list, opts...)
}

func (f failingWatch) Watch(context.Context, client.ObjectList, ...client.ListOption) (watch.Interface, error) {
	return nil, errInjected
}

// TestWaitBacksOffWhenWatchFails: when a watch cannot be opened (say RBAC
// grants list but not watch), the executor lists again after a backoff,
// not in a hot loop against the API server. The bound is loose: with
// backoff a two-second wait lists a handful of times, without it
// thousands.
func TestWaitBacksOffWhenWatchFails(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	var lists atomic.Int64
	e := stages.NewExecutor(failingWatch{WithWatch: c, lists: &lists})
	checker, err := stages.NewChecker(nil)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(testContext(t), 2*time.Second)
	defer cancel()
	v, err := e.Wait(ctx, []*unstructured.Unstructured{configMap(ns, "absent", nil)}, checker, owner)
	if err != nil || v.Ready {
		t.Fatalf("Wait = %+v, %v; want not ready, no error", v, err)
	}
	t.Logf("listed %d times in 2s while the watch failed", lists.Load())
	if n := lists.Load(); n > 50 {
		t.Errorf("listed %d times while the watch failed, want a handful: no backoff", n)
	}
}

// TestApplyCRDThatIsNeverEstablished: a CRD whose names the API server
// refuses is never Established. The apply must not wait for it forever,
// nor go on to apply objects that may need it; it fails and names the CRD.
func TestApplyCRDThatIsNeverEstablished(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	defer stages.SetCRDEstablishTimeout(3 * time.Second)()
	objs := append(loadObjects(t, "conflicting-crds.yaml", ns), configMap(ns, "after", map[string]any{"k": "v"}))
	stage := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Things", Action: capstanv1.StageActionApply}, Objects: objs}

	// The context has a deadline well past the executor's own bound on
	// the wait, as the reconciler's apply has.
	res := e.ApplyStage(testContext(t), stage, owner)
	if res.State != capstanv1.StageFailed {
		t.Fatalf("ApplyStage = %s (message %q), want %s", res.State, res.Message, capstanv1.StageFailed)
	}
	for _, want := range []string{"wait for CustomResourceDefinitions", ".conflict.test.capstan.dev", "is already in use"} {
		if !strings.Contains(res.Message, want) {
			t.Errorf("message does not mention %q:\n%s", want, res.Message)
		}
	}
	if _, applied := actions(res.ChangeSet)["ConfigMap/"+ns+"/after"]; applied {
		t.Errorf("the ConfigMap was applied although the CRDs before it were not established: %v", actions(res.ChangeSet))
	}
}

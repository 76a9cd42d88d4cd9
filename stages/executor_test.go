package stages_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/ssa"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// owner is the ClusterDeployment the tests apply for.
var owner = stages.Owner{Name: "cluster-a", Namespace: "capstan-system"}

const widgetAPIVersion = "test.capstan.dev/v1alpha1"

func configMap(ns, name string, data map[string]any) *unstructured.Unstructured {
	cm := object("v1", "ConfigMap", ns, name)
	cm.Object["data"] = data
	return cm
}

func widget(ns, name string, spec map[string]any) *unstructured.Unstructured {
	w := object(widgetAPIVersion, "Widget", ns, name)
	w.Object["spec"] = spec
	return w
}

// loadObjects reads a YAML stream from testdata and puts every object that
// is not cluster-wide into ns.
func loadObjects(t testing.TB, file, ns string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read %s: %v", file, err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &u.Object); err != nil {
			t.Fatalf("read %s: %v", file, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if u.GetKind() != "CustomResourceDefinition" && u.GetKind() != "Namespace" {
			u.SetNamespace(ns)
		}
		objs = append(objs, u)
	}
	return objs
}

// actions maps each ChangeSet subject to what was done to it.
func actions(cs *ssa.ChangeSet) map[string]ssa.Action {
	if cs == nil {
		return nil
	}
	return cs.ToMap()
}

func refs(objs []*unstructured.Unstructured) []string {
	out := make([]string, len(objs))
	for i, o := range objs {
		out[i] = stages.ObjectRef(o)
	}
	return out
}

func getLive(t testing.TB, c client.Client, obj *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(obj.GroupVersionKind())
	if err := c.Get(testContext(t), client.ObjectKeyFromObject(obj), live); err != nil {
		t.Fatalf("get %s: %v", stages.ObjectRef(obj), err)
	}
	return live
}

func TestApply(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	e := stages.NewExecutor(c)
	objs := []*unstructured.Unstructured{
		configMap(ns, "settings", map[string]any{"colour": "red"}),
		widget(ns, "sprocket", map[string]any{"size": int64(2)}),
	}
	objs[0].SetLabels(map[string]string{"app": "demo"})

	t.Run("creates objects labelled with owner and stage", func(t *testing.T) {
		cs, err := e.Apply(ctx, objs, "Config", owner)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]ssa.Action{
			"ConfigMap/" + ns + "/settings": ssa.CreatedAction,
			"Widget/" + ns + "/sprocket":    ssa.CreatedAction,
		}
		if got := actions(cs); !maps.Equal(got, want) {
			t.Errorf("change set = %v, want %v", got, want)
		}
		for _, obj := range objs {
			labels := getLive(t, c, obj).GetLabels()
			for k, v := range map[string]string{
				"capstan.dev/name":      owner.Name,
				"capstan.dev/namespace": owner.Namespace,
				"capstan.dev/stage":     "Config",
			} {
				if labels[k] != v {
					t.Errorf("%s: label %s = %q, want %q (labels %v)", stages.ObjectRef(obj), k, labels[k], v, labels)
				}
			}
		}
		if got := getLive(t, c, objs[0]).GetLabels()["app"]; got != "demo" {
			t.Errorf("the object's own label app = %q, want demo", got)
		}
		if _, labelled := objs[0].GetLabels()["capstan.dev/stage"]; labelled || len(objs[1].GetLabels()) > 0 {
			t.Errorf("Apply labelled the caller's objects: %v, %v", objs[0].GetLabels(), objs[1].GetLabels())
		}
	})

	t.Run("applying again leaves them unchanged and writes nothing", func(t *testing.T) {
		mark := log.mark()
		cs, err := e.Apply(ctx, objs, "Config", owner)
		if err != nil {
			t.Fatal(err)
		}
		for subject, action := range actions(cs) {
			if action != ssa.UnchangedAction {
				t.Errorf("%s: %s, want %s", subject, action, ssa.UnchangedAction)
			}
		}
		if len(cs.Entries) != len(objs) {
			t.Errorf("change set has %d entries, want %d", len(cs.Entries), len(objs))
		}
		if writes := log.writesSince(mark, false); len(writes) > 0 {
			t.Errorf("second apply wrote: %v", writes)
		}
	})

	t.Run("a changed object is configured", func(t *testing.T) {
		changed := slices.Clone(objs)
		changed[0] = configMap(ns, "settings", map[string]any{"colour": "blue"})
		cs, err := e.Apply(ctx, changed, "Config", owner)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]ssa.Action{
			"ConfigMap/" + ns + "/settings": ssa.ConfiguredAction,
			"Widget/" + ns + "/sprocket":    ssa.UnchangedAction,
		}
		if got := actions(cs); !maps.Equal(got, want) {
			t.Errorf("change set = %v, want %v", got, want)
		}
	})
}

func widgetStage(objs ...*unstructured.Unstructured) *stages.Stage {
	return &stages.Stage{
		StageSpec: capstanv1.StageSpec{
			Name:      "Widgets",
			Action:    capstanv1.StageActionApply,
			ReadyWhen: []capstanv1.ReadinessCheck{{Kind: "Widget", CEL: "object.status.ready == true"}},
		},
		Objects: objs,
	}
}

// TestRunInProgressAtDeadline: a stage whose objects are applied but not
// ready when the context ends is InProgress, not Failed, and says which
// object it waits for.
func TestRunInProgressAtDeadline(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	stage := widgetStage(widget(ns, "slow", map[string]any{"size": int64(1)}))

	ctx, cancel := context.WithTimeout(testContext(t), 5*time.Second)
	defer cancel()
	res := e.Run(ctx, stage, owner, stages.RunOptions{})

	if res.State != capstanv1.StageInProgress || res.Err != nil {
		t.Fatalf("Run = %s (err %v, message %q), want %s without error", res.State, res.Err, res.Message, capstanv1.StageInProgress)
	}
	for _, want := range []string{"Widget/" + ns + "/slow", "object.status.ready == true"} {
		if !strings.Contains(res.Message, want) {
			t.Errorf("message %q does not mention %q", res.Message, want)
		}
	}
	if got := actions(res.ChangeSet)["Widget/"+ns+"/slow"]; got != ssa.CreatedAction {
		t.Errorf("change set = %v, want the widget created", actions(res.ChangeSet))
	}
	if res.Stage != "Widgets" {
		t.Errorf("result names stage %q, want Widgets", res.Stage)
	}
}

// TestRunWakesOnWatchEvent: the status change that makes a stage ready
// arrives after Run listed the objects and started watching; Run must see
// it from the watch and return Ready long before its deadline.
func TestRunWakesOnWatchEvent(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	e := stages.NewExecutor(c)
	w := widget(ns, "sprocket", map[string]any{"size": int64(3)})
	other := widget(ns, "cog", map[string]any{"size": int64(1)})

	mark := log.mark()
	results := make(chan stages.Result, 1)
	go func() { results <- e.Run(ctx, widgetStage(w, other), owner, stages.RunOptions{}) }()

	// Run lists, then watches; only then does the "controller" act.
	if err := log.waitForWatch(ctx, mark, "/namespaces/"+ns+"/widgets"); err != nil {
		t.Fatal(err)
	}
	patching := time.Now()
	for _, obj := range []*unstructured.Unstructured{w, other} {
		patch := client.RawPatch(types.MergePatchType, []byte(`{"status":{"ready":true}}`))
		if err := c.Status().Patch(ctx, obj.DeepCopy(), patch); err != nil {
			t.Fatalf("mark %s ready: %v", stages.ObjectRef(obj), err)
		}
	}

	select {
	case res := <-results:
		t.Logf("Run returned %s %s after the status patches began", res.State, time.Since(patching))
		if res.State != capstanv1.StageReady || res.Err != nil {
			t.Fatalf("Run = %s (err %v, message %q), want %s", res.State, res.Err, res.Message, capstanv1.StageReady)
		}
	case <-ctx.Done():
		t.Fatal("Run did not return before the test's deadline")
	}
}

// TestRunAppliesCRDAndItsObjectsInOneStage: a stage may carry a CRD and
// objects of its kind; the CRD goes first and is Established before they
// are applied.
func TestRunAppliesCRDAndItsObjectsInOneStage(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	objs := loadObjects(t, "gadgets.yaml", ns)
	stage := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Gadgets", Action: capstanv1.StageActionApply}, Objects: objs}

	res := e.Run(ctx, stage, owner, stages.RunOptions{})
	if res.State != capstanv1.StageReady {
		t.Fatalf("Run = %s (err %v, message %q), want %s", res.State, res.Err, res.Message, capstanv1.StageReady)
	}
	got := actions(res.ChangeSet)
	for _, ref := range refs(objs) {
		if _, ok := got[ref]; !ok {
			t.Errorf("change set %v does not list %s", got, ref)
		}
	}
	for _, ref := range []string{"Gadget/" + ns + "/first", "Gadget/" + ns + "/second"} {
		if got[ref] != ssa.CreatedAction {
			t.Errorf("%s: %s, want %s", ref, got[ref], ssa.CreatedAction)
		}
	}
	if first := res.ChangeSet.Entries[0].Subject; !strings.HasPrefix(first, "CustomResourceDefinition/") {
		t.Errorf("first change is %s, want the CustomResourceDefinition", first)
	}
}

// TestRunAppliesFreshCRDsRepeatedly: Established comes before discovery
// lists a new kind, and an object applied in between fails as if its CRD
// were missing (stalled!). That window is short, so the stage is applied
// with a CRD of a new group twenty times. Before the executor waited for
// discovery, between one in fifteen and one in a hundred failed, depending
// on the load of the machine.
func TestRunAppliesFreshCRDsRepeatedly(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	for i := range 20 {
		c, _ := newClient(t)
		e := stages.NewExecutor(c)
		group := fmt.Sprintf("fresh%d.test.capstan.dev", i)
		objs := loadObjects(t, "gadgets.yaml", ns)
		for _, obj := range objs {
			if obj.GetKind() == "CustomResourceDefinition" {
				obj.SetName("gadgets." + group)
				if err := unstructured.SetNestedField(obj.Object, group, "spec", "group"); err != nil {
					t.Fatal(err)
				}
			} else {
				obj.SetAPIVersion(group + "/v1alpha1")
			}
		}
		stage := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Gadgets", Action: capstanv1.StageActionApply}, Objects: objs}
		if res := e.Run(ctx, stage, owner, stages.RunOptions{}); res.State != capstanv1.StageReady {
			t.Errorf("group %s: Run = %s: %s", group, res.State, res.Message)
		}
	}
}

// TestRunStalls pins the failures retrying cannot fix: each names the
// object and is stalled (failure.PolicyStalled), and since every object is dry-run before
// any is applied, the stage's valid objects are left unapplied too.
func TestRunStalls(t *testing.T) {
	cases := []struct {
		name    string
		bad     func(ns string) *unstructured.Unstructured
		wantErr []string
	}{
		{
			name: "kind without a CRD",
			bad: func(ns string) *unstructured.Unstructured {
				return object("missing.test.capstan.dev/v1", "Doohickey", ns, "lost")
			},
			wantErr: []string{"Doohickey/%s/lost", "does not serve missing.test.capstan.dev/v1, Kind=Doohickey", "CustomResourceDefinition installed?"},
		},
		{
			name: "ConfigMap with a number as a data value",
			bad: func(ns string) *unstructured.Unstructured {
				return configMap(ns, "numeric", map[string]any{"count": int64(3)})
			},
			wantErr: []string{"ConfigMap/%s/numeric"},
		},
		{
			name: "Widget below its schema's minimum",
			bad: func(ns string) *unstructured.Unstructured {
				return widget(ns, "tiny", map[string]any{"size": int64(0)})
			},
			wantErr: []string{"Widget/%s/tiny", "spec.size"},
		},
		{
			name: "Widget without a required field",
			bad: func(ns string) *unstructured.Unstructured {
				return widget(ns, "shapeless", map[string]any{})
			},
			wantErr: []string{"Widget/%s/shapeless", "spec.size: Required value"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			c, _ := newClient(t)
			e := stages.NewExecutor(c)
			good := configMap(ns, "fine", map[string]any{"a": "b"})
			stage := &stages.Stage{
				StageSpec: capstanv1.StageSpec{Name: "Mixed", Action: capstanv1.StageActionApply},
				Objects:   []*unstructured.Unstructured{good, tc.bad(ns)},
			}

			res := e.Run(testContext(t), stage, owner, stages.RunOptions{})
			if res.State != capstanv1.StageFailed {
				t.Fatalf("Run = %s (message %q), want %s", res.State, res.Message, capstanv1.StageFailed)
			}
			if !stages.IsStalled(res.Err) {
				t.Errorf("error is not stalled: %v", res.Err)
			}
			for _, want := range tc.wantErr {
				want = strings.ReplaceAll(want, "%s", ns)
				if !strings.Contains(res.Err.Error(), want) {
					t.Errorf("error does not mention %q:\n%v", want, res.Err)
				}
			}
			if res.Message != res.Err.Error() {
				t.Errorf("message %q differs from the error %q", res.Message, res.Err)
			}
			if strings.Contains(res.Err.Error(), "ConfigMap/"+ns+"/fine") {
				t.Errorf("error blames the valid object:\n%v", res.Err)
			}
			if res.Applied {
				t.Errorf("result says the stage was applied")
			}
			err := c.Get(testContext(t), client.ObjectKeyFromObject(good), &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}})
			if !apierrors.IsNotFound(err) {
				t.Errorf("get the valid object: %v, want NotFound: a wave with an invalid object applies nothing", err)
			}
		})
	}
}

// TestRunBadReadinessCheckStalls: an expression that does not compile
// stalls the stage. (BuildPlan reports it before any stage runs; this is
// the executor's own guard.)
func TestRunBadReadinessCheckStalls(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	stage := widgetStage(widget(ns, "w", map[string]any{"size": int64(1)}))
	stage.ReadyWhen = []capstanv1.ReadinessCheck{{CEL: "object.status.ready +"}}

	res := e.Run(testContext(t), stage, owner, stages.RunOptions{})
	if res.State != capstanv1.StageFailed || !stages.IsStalled(res.Err) {
		t.Fatalf("Run = %s (err %v), want a stalled failure", res.State, res.Err)
	}
	if !strings.Contains(res.Message, "stage Widgets: readyWhen[0].cel") {
		t.Errorf("message %q does not name the stage and the field", res.Message)
	}
}

// TestRunSkipApplyDoesNotWrite: a later attempt at the same revision only
// waits; it sends no write, not even a dry run.
func TestRunSkipApplyDoesNotWrite(t *testing.T) {
	ns := newNamespace(t)
	c, log := newClient(t)
	e := stages.NewExecutor(c)
	stage := &stages.Stage{
		StageSpec: capstanv1.StageSpec{Name: "Config", Action: capstanv1.StageActionApply},
		Objects:   []*unstructured.Unstructured{configMap(ns, "a", map[string]any{"k": "v"}), configMap(ns, "b", map[string]any{"k": "v"})},
	}

	t.Run("objects not applied yet are awaited as not found", func(t *testing.T) {
		mark := log.mark()
		ctx, cancel := context.WithTimeout(testContext(t), 3*time.Second)
		defer cancel()
		res := e.Run(ctx, stage, owner, stages.RunOptions{SkipApply: true})
		if res.State != capstanv1.StageInProgress {
			t.Fatalf("Run = %s (err %v, message %q), want %s", res.State, res.Err, res.Message, capstanv1.StageInProgress)
		}
		if want := "waiting for ConfigMap/" + ns + "/a: not found (and 1 more)"; res.Message != want {
			t.Errorf("message = %q, want %q", res.Message, want)
		}
		if writes := log.writesSince(mark, true); len(writes) > 0 {
			t.Errorf("Run with SkipApply wrote: %v", writes)
		}
		if res.ChangeSet != nil {
			t.Errorf("Run with SkipApply returned a change set: %v", res.ChangeSet)
		}
	})

	t.Run("applied objects are found ready", func(t *testing.T) {
		if res := e.Run(testContext(t), stage, owner, stages.RunOptions{}); res.State != capstanv1.StageReady {
			t.Fatalf("first Run = %s (err %v)", res.State, res.Err)
		}
		mark := log.mark()
		res := e.Run(testContext(t), stage, owner, stages.RunOptions{SkipApply: true})
		if res.State != capstanv1.StageReady {
			t.Fatalf("Run = %s (err %v, message %q), want %s", res.State, res.Err, res.Message, capstanv1.StageReady)
		}
		if writes := log.writesSince(mark, true); len(writes) > 0 {
			t.Errorf("Run with SkipApply wrote: %v", writes)
		}
	})
}

// TestRunWaitStage: a wait stage applies nothing and is ready when the
// objects an earlier stage applied are.
func TestRunWaitStage(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	e := stages.NewExecutor(c)
	w := widget(ns, "w", map[string]any{"size": int64(1)})
	if _, err := e.Apply(ctx, []*unstructured.Unstructured{w}, "Apply", owner); err != nil {
		t.Fatal(err)
	}
	if err := c.Status().Patch(ctx, w.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"status":{"ready":true}}`))); err != nil {
		t.Fatal(err)
	}
	stage := widgetStage(w)
	stage.Action = capstanv1.StageActionWait

	mark := log.mark()
	res := e.Run(ctx, stage, owner, stages.RunOptions{})
	if res.State != capstanv1.StageReady {
		t.Fatalf("Run = %s (err %v, message %q), want %s", res.State, res.Err, res.Message, capstanv1.StageReady)
	}
	if writes := log.writesSince(mark, true); len(writes) > 0 {
		t.Errorf("wait stage wrote: %v", writes)
	}
}

// TestRunOtherOwnersObjectsDoNotCount: an object of the same name applied
// for another ClusterDeployment is not this stage's object.
func TestRunOtherOwnersObjectsDoNotCount(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	cm := configMap(ns, "shared", map[string]any{"k": "v"})
	if _, err := e.Apply(ctx, []*unstructured.Unstructured{cm}, "Config", stages.Owner{Name: "someone-else", Namespace: "capstan-system"}); err != nil {
		t.Fatal(err)
	}
	stage := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Config", Action: capstanv1.StageActionWait}, Objects: []*unstructured.Unstructured{cm}}

	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	res := e.Run(waitCtx, stage, owner, stages.RunOptions{})
	if res.State != capstanv1.StageInProgress || !strings.Contains(res.Message, "not found") {
		t.Errorf("Run = %s (message %q), want %s waiting for ConfigMap/%s/shared: not found", res.State, res.Message, capstanv1.StageInProgress, ns)
	}
}

func TestRunUnsupportedActionStalls(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	stage := &stages.Stage{
		StageSpec: capstanv1.StageSpec{Name: "Teleport", Action: "teleport"},
		Objects:   []*unstructured.Unstructured{configMap(ns, "a", nil)},
	}
	res := e.Run(testContext(t), stage, owner, stages.RunOptions{})
	if res.State != capstanv1.StageFailed || !stages.IsStalled(res.Err) || !strings.Contains(res.Message, `action "teleport" is not supported`) {
		t.Errorf("Run = %s (err %v), want a stalled failure naming the action", res.State, res.Err)
	}
}

// A pivot stage moves into the cluster its kubeConfig names; without one
// it can never move anything, and says what to add.
func TestPivotWithoutTargetStalls(t *testing.T) {
	ns := newNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	stage := &stages.Stage{
		StageSpec: capstanv1.StageSpec{Name: "Pivot", Action: capstanv1.StageActionPivot},
		Objects:   []*unstructured.Unstructured{configMap(ns, "a", nil)},
	}
	res := e.Run(testContext(t), stage, owner, stages.RunOptions{})
	if res.State != capstanv1.StageFailed || !stages.IsStalled(res.Err) || !strings.Contains(res.Message, "kubeConfig") {
		t.Errorf("Run = %s (err %v), want a stalled failure asking for kubeConfig", res.State, res.Err)
	}
}

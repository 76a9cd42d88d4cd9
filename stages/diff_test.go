package stages_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/stages"
)

// plantedSecret is a value no diff may print, in any form.
const plantedSecret = "planted-Secret-value-7f3a9c"

func secret(ns, name string, data map[string]string) *unstructured.Unstructured {
	obj := object("v1", "Secret", ns, name)
	values := map[string]any{}
	for k, v := range data {
		values[k] = base64.StdEncoding.EncodeToString([]byte(v))
	}
	obj.Object["data"] = values
	return obj
}

func withLabel(obj *unstructured.Unstructured, k, v string) *unstructured.Unstructured {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[k] = v
	obj.SetLabels(labels)
	return obj
}

func pvc(ns, name string) *unstructured.Unstructured {
	obj := object("v1", "PersistentVolumeClaim", ns, name)
	obj.Object["spec"] = map[string]any{
		"accessModes": []any{"ReadWriteOnce"},
		"resources":   map[string]any{"requests": map[string]any{"storage": "1Gi"}},
	}
	return obj
}

// diffActions maps each object of the diff to its action.
func diffActions(d *stages.PlanDiff) map[string]stages.DiffAction {
	out := map[string]stages.DiffAction{}
	for _, s := range d.Stages {
		for _, o := range s.Objects {
			out[o.Ref] = o.Action
		}
	}
	for _, o := range d.Prune {
		out["prune "+o.Ref] = o.Action
	}
	return out
}

func objectDiff(t *testing.T, d *stages.PlanDiff, ref string) stages.ObjectDiff {
	t.Helper()
	for _, s := range d.Stages {
		for _, o := range s.Objects {
			if o.Ref == ref {
				return o
			}
		}
	}
	t.Fatalf("no %s in the diff", ref)
	return stages.ObjectDiff{}
}

func fieldStrings(o stages.ObjectDiff) []string {
	var out []string
	for _, f := range o.Fields {
		out = append(out, f.String())
	}
	return out
}

// TestDiffPlan applies a first revision, then diffs a second one against
// the live objects: every kind of outcome in one plan, all problems at
// once, nothing written, no Secret value shown.
func TestDiffPlan(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	installDeploymentCRD(t, c)
	e := stages.NewExecutor(c)
	east := stages.Owner{Name: "east", Namespace: ns}
	west := stages.Owner{Name: "west", Namespace: ns}
	createDeployment(t, c, east)
	createDeployment(t, c, west)

	// The first revision, applied.
	first := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Config", Action: capstanv1.StageActionApply}, Objects: []*unstructured.Unstructured{
		configMap(ns, "same", map[string]any{"a": "1"}),
		configMap(ns, "edited", map[string]any{"a": "1", "gone": "x"}),
		secret(ns, "creds", map[string]string{"password": plantedSecret + "-old", "token": "kept-token-value"}),
		configMap(ns, "dropped", map[string]any{"a": "1"}),
		withLabel(configMap(ns, "pinned", nil), stages.PruneKey, "disabled"),
		pvc(ns, "data"),
	}}
	if res := e.ApplyStage(ctx, first, east); res.State == capstanv1.StageFailed {
		t.Fatal(res.Err)
	}
	inv := &capstanv1.Inventory{}
	stages.MergeInventory(inv, e.InventoryOf(first), []string{"Config"})
	if _, err := e.Apply(ctx, []*unstructured.Unstructured{configMap(ns, "theirs", map[string]any{"by": "west"})}, "Config", west); err != nil {
		t.Fatal(err)
	}

	// The second revision.
	edited := configMap(ns, "edited", map[string]any{"a": "2", "b": "new"})
	edited.SetLabels(map[string]string{"tier": "gold"})
	plan, err := stages.BuildPlan([]capstanv1.StageSpec{
		{Name: "Config", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"ConfigMap", "Secret", "Widget", "Gizmo"}}},
		{Name: "Ready", Action: capstanv1.StageActionWait, Select: capstanv1.Selector{Kinds: []string{"ConfigMap"}, Names: []string{"same"}}},
	}, []*unstructured.Unstructured{
		configMap(ns, "same", map[string]any{"a": "1"}),
		edited,
		secret(ns, "creds", map[string]string{"password": plantedSecret, "token": "kept-token-value", "extra": plantedSecret + "-2"}),
		configMap(ns, "fresh", map[string]any{"a": "1"}),
		configMap(ns, "theirs", map[string]any{"by": "east"}),
		widget(ns, "tiny", map[string]any{"size": int64(0)}),
		object("nowhere.test.capstan.dev/v1", "Gizmo", ns, "ghost"),
	})
	if err != nil {
		t.Fatal(err)
	}

	mark := log.mark()
	d, err := e.DiffPlan(ctx, plan, east, stages.DiffOptions{Inventory: inv, NewRevision: true})
	if err != nil {
		t.Fatal(err)
	}
	if writes := log.writesSince(mark, false); len(writes) > 0 {
		t.Errorf("the diff wrote to the cluster: %v", writes)
	}

	want := map[string]stages.DiffAction{
		"ConfigMap/" + ns + "/same":                   stages.DiffUnchanged,
		"ConfigMap/" + ns + "/edited":                 stages.DiffChange,
		"Secret/" + ns + "/creds":                     stages.DiffChange,
		"ConfigMap/" + ns + "/fresh":                  stages.DiffCreate,
		"ConfigMap/" + ns + "/theirs":                 stages.DiffConflict,
		"Widget/" + ns + "/tiny":                      stages.DiffInvalid,
		"Gizmo/" + ns + "/ghost":                      stages.DiffInvalid,
		"prune ConfigMap/" + ns + "/dropped":          stages.DiffDelete,
		"prune ConfigMap/" + ns + "/pinned":           stages.DiffKept,
		"prune PersistentVolumeClaim/" + ns + "/data": stages.DiffHeld,
	}
	got := diffActions(d)
	for ref, action := range want {
		if got[ref] != action {
			t.Errorf("%s: %q, want %q", ref, got[ref], action)
		}
	}
	if len(got) != len(want) {
		t.Errorf("diff has %d objects, want %d: %v", len(got), len(want), got)
	}

	t.Run("a change lists only the fields that differ", func(t *testing.T) {
		fields := fieldStrings(objectDiff(t, d, "ConfigMap/"+ns+"/edited"))
		wantFields := []string{`data.a: "1" -> "2"`, "data.b: (none) -> new", "data.gone: x -> (none)", "metadata.labels.tier: (none) -> gold"}
		if !slices.Equal(fields, wantFields) {
			t.Errorf("fields = %q, want %q", fields, wantFields)
		}
		if f := objectDiff(t, d, "ConfigMap/"+ns+"/same").Fields; len(f) != 0 {
			t.Errorf("unchanged object has field diffs %v", f)
		}
	})

	t.Run("a Secret's values are never shown", func(t *testing.T) {
		fields := fieldStrings(objectDiff(t, d, "Secret/"+ns+"/creds"))
		wantFields := []string{"data.extra: (added)", "data.password: (changed)"}
		if !slices.Equal(fields, wantFields) {
			t.Errorf("fields = %q, want %q", fields, wantFields)
		}
		data, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		text := string(data) + fmt.Sprintf("%+v", *d)
		for _, v := range []string{plantedSecret, base64.StdEncoding.EncodeToString([]byte(plantedSecret))} {
			if strings.Contains(text, v) {
				t.Errorf("the diff shows a Secret value %q", v)
			}
		}
		found := false
		for _, s := range d.SecretData() {
			found = found || string(s["password"]) == plantedSecret
		}
		if !found {
			t.Error("SecretData does not hold the rendered Secret's value, for scrubbing")
		}
	})

	t.Run("problems are collected, each with what the executor would say", func(t *testing.T) {
		problems := d.Problems()
		if len(problems) != 3 {
			t.Fatalf("problems = %+v, want 3", problems)
		}
		conflict := objectDiff(t, d, "ConfigMap/"+ns+"/theirs")
		if !strings.Contains(conflict.Error, "belongs to ClusterDeployment "+ns+"/west") {
			t.Errorf("conflict error = %q", conflict.Error)
		}
		invalid := objectDiff(t, d, "Widget/"+ns+"/tiny")
		if invalid.Field != "spec.size" || !strings.Contains(invalid.Error, "spec.size") {
			t.Errorf("invalid: field %q, error %q; want field spec.size", invalid.Field, invalid.Error)
		}
		ghost := objectDiff(t, d, "Gizmo/"+ns+"/ghost")
		if !strings.Contains(ghost.Error, "does not serve") {
			t.Errorf("not served: error %q", ghost.Error)
		}
	})

	t.Run("stages that work and stages re-checked", func(t *testing.T) {
		config, ready := d.Stages[0], d.Stages[1]
		if !config.Works || !config.Runs || config.Why != "create 1, change 2, 3 objects fail" {
			t.Errorf("Config: works %v runs %v why %q", config.Works, config.Runs, config.Why)
		}
		if ready.Works || !ready.Runs || !strings.Contains(ready.Why, "re-checked") {
			t.Errorf("Ready: works %v runs %v why %q", ready.Works, ready.Runs, ready.Why)
		}
		if !d.Changes() {
			t.Error("Changes() = false")
		}
		c := d.Counts()
		if c.Create != 1 || c.Change != 2 || c.Unchanged != 1 || c.Delete != 1 || c.Held != 1 || c.Kept != 1 || c.Problems != 3 {
			t.Errorf("counts = %+v", c)
		}
	})

	t.Run("destructive prune allowed deletes the held object", func(t *testing.T) {
		d, err := e.DiffPlan(ctx, plan, east, stages.DiffOptions{Inventory: inv, Destructive: true})
		if err != nil {
			t.Fatal(err)
		}
		if got := diffActions(d)["prune PersistentVolumeClaim/"+ns+"/data"]; got != stages.DiffDelete {
			t.Errorf("PVC with spec.prune.destructive: %q, want delete", got)
		}
	})
}

// TestDiffPlanUnchangedRevision: the revision that is applied diffs to
// nothing, and no stage runs again.
func TestDiffPlanUnchangedRevision(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	stage := capstanv1.StageSpec{Name: "Config", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"*"}}}
	objs := []*unstructured.Unstructured{configMap(ns, "a", map[string]any{"k": "v"}), widget(ns, "w", map[string]any{"size": int64(3)})}
	plan, err := stages.BuildPlan([]capstanv1.StageSpec{stage}, objs)
	if err != nil {
		t.Fatal(err)
	}
	if res := e.ApplyStage(ctx, &plan.Stages[0], owner); res.State == capstanv1.StageFailed {
		t.Fatal(res.Err)
	}
	d, err := e.DiffPlan(ctx, plan, owner, stages.DiffOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Changes() || d.Stages[0].Runs {
		t.Errorf("diff of the applied revision: changes %v, stage runs %v (%+v)", d.Changes(), d.Stages[0].Runs, d.Stages[0])
	}
}

// TestDiffPlanObjectsOfDefinitionsInThePlan: a CRD and a Namespace the
// plan creates make the objects that need them creates the server cannot
// check yet, not errors.
func TestDiffPlanObjectsOfDefinitionsInThePlan(t *testing.T) {
	newNamespace(t) // skips under -short
	ctx := testContext(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	nsName := fmt.Sprintf("diff-new-%d", time.Now().UnixNano())
	// A group of its own: another test of the package applies gadgets.yaml
	// as it is, and a CRD outlives its test.
	group := nsName + ".test.capstan.dev"
	var crd *unstructured.Unstructured
	for _, obj := range loadObjects(t, "gadgets.yaml", "") {
		if obj.GetKind() == "CustomResourceDefinition" {
			crd = obj
			crd.SetName("gadgets." + group)
			if err := unstructured.SetNestedField(crd.Object, group, "spec", "group"); err != nil {
				t.Fatal(err)
			}
		}
	}
	gadget := object(group+"/v1alpha1", "Gadget", nsName, "g")
	plan, err := stages.BuildPlan([]capstanv1.StageSpec{
		{Name: "All", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"*"}}},
	}, []*unstructured.Unstructured{object("v1", "Namespace", "", nsName), crd, gadget, configMap(nsName, "cm", nil)})
	if err != nil {
		t.Fatal(err)
	}
	d, err := e.DiffPlan(ctx, plan, owner, stages.DiffOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range d.Stages[0].Objects {
		if o.Action != stages.DiffCreate {
			t.Errorf("%s: %s (%s), want create", o.Ref, o.Action, o.Error)
		}
	}
	if o := objectDiff(t, d, "ConfigMap/"+nsName+"/cm"); !strings.Contains(o.Note, "Namespace is created by this plan") {
		t.Errorf("ConfigMap in a new Namespace: note %q", o.Note)
	}
}

// TestDiffPlanMachineDeploymentRollout: a new version and worker count of a
// MachineDeployment say the rolling update that follows.
func TestDiffPlanMachineDeploymentRollout(t *testing.T) {
	ns := providerNamespace(t)
	ctx := testContext(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	var md *unstructured.Unstructured
	for _, obj := range loadObjects(t, capm3Fixture, ns) {
		if obj.GetKind() == "MachineDeployment" {
			md = obj
		}
	}
	spec := []capstanv1.StageSpec{{Name: "WorkersReady", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"MachineDeployment"}}}}
	plan, err := stages.BuildPlan(spec, []*unstructured.Unstructured{md})
	if err != nil {
		t.Fatal(err)
	}
	if res := e.ApplyStage(ctx, &plan.Stages[0], owner); res.State == capstanv1.StageFailed {
		t.Fatal(res.Err)
	}
	bumped := md.DeepCopy()
	if err := unstructured.SetNestedField(bumped.Object, int64(3), "spec", "replicas"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(bumped.Object, "v1.36.0", "spec", "template", "spec", "version"); err != nil {
		t.Fatal(err)
	}
	plan, err = stages.BuildPlan(spec, []*unstructured.Unstructured{bumped})
	if err != nil {
		t.Fatal(err)
	}
	d, err := e.DiffPlan(ctx, plan, owner, stages.DiffOptions{NewRevision: true})
	if err != nil {
		t.Fatal(err)
	}
	rollouts := d.Rollouts()
	if len(rollouts) != 1 {
		t.Fatalf("rollouts = %+v, want one", rollouts)
	}
	r := rollouts[0]
	if want := []string{"version: v1.35.4 -> v1.36.0", "replicas: 2 -> 3"}; !slices.Equal(r.Changes, want) {
		t.Errorf("changes = %q, want %q", r.Changes, want)
	}
	if !strings.Contains(r.Strategy, "rolling update of 3 machines: at most 1 new machines above 3 and 0 unavailable") ||
		!strings.Contains(r.Strategy, "1 new machines") {
		t.Errorf("strategy = %q", r.Strategy)
	}
	fields := fieldStrings(objectDiff(t, d, "MachineDeployment/"+ns+"/mgmt-workers"))
	if want := []string{"spec.replicas: 2 -> 3", "spec.template.spec.version: v1.35.4 -> v1.36.0"}; !slices.Equal(fields, want) {
		t.Errorf("fields = %q, want %q", fields, want)
	}
}

// installLCMCRDs serves LCMClusters and LCMMachines in the package's
// control plane, once.
var installLCMCRDs = sync.OnceValue(func() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return testenv.InstallCRDs(ctx, env.Config, "../manifests/crds/lcm.capstan.dev_lcmclusters.yaml", "../manifests/crds/lcm.capstan.dev_lcmmachines.yaml")
})

func lcmItems(t, version string) []any {
	return []any{
		map[string]any{"name": "download", "phase": "prepare", "runner": "downloader", "version": version},
		map[string]any{"name": "join-" + t, "phase": "deploy", "runner": "ansible", "version": version},
	}
}

func lcmClusterObject(ns, version string) *unstructured.Unstructured {
	obj := object("lcm.capstan.dev/v1alpha1", "LCMCluster", ns, "east")
	obj.Object["spec"] = map[string]any{
		"release": "r-" + version,
		"machineTypes": map[string]any{
			"manager": lcmItems("manager", version),
			"worker":  lcmItems("worker", version),
		},
	}
	return obj
}

func lcmMachineObject(ns, name, typ string) *unstructured.Unstructured {
	obj := object("lcm.capstan.dev/v1alpha1", "LCMMachine", ns, name)
	obj.Object["spec"] = map[string]any{"type": typ, "clusterName": "east"}
	return obj
}

// TestDiffPlanLCMUpgradeBatches: a new release of an LCMCluster whose
// machines are all Ready is rolled out by the lcm profile's stages:
// prepare everywhere, managers one by one, the first worker alone, then
// the other workers in batches of spec.rollout.workerBatchSize, each
// deployed worker drained first.
func TestDiffPlanLCMUpgradeBatches(t *testing.T) {
	ns := newNamespace(t)
	if err := installLCMCRDs(); err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	machines := []*unstructured.Unstructured{
		lcmMachineObject(ns, "m-0", "manager"), lcmMachineObject(ns, "m-1", "manager"),
		lcmMachineObject(ns, "w-0", "worker"), lcmMachineObject(ns, "w-1", "worker"),
		lcmMachineObject(ns, "w-2", "worker"), lcmMachineObject(ns, "w-3", "worker"),
	}
	specs, err := stages.StageSpecs(capstanv1.ClusterDeploymentSpec{Profile: "lcm", Rollout: &capstanv1.RolloutPolicy{WorkerBatchSize: ptr.To[int32](2)}})
	if err != nil {
		t.Fatal(err)
	}
	planOf := func(version string) *stages.Plan {
		objs := []*unstructured.Unstructured{lcmClusterObject(ns, version)}
		for _, m := range machines {
			objs = append(objs, m.DeepCopy())
		}
		plan, err := stages.BuildPlan(specs, objs)
		if err != nil {
			t.Fatal(err)
		}
		return plan
	}
	// Release 1 is deployed: every machine has its items, and its agent
	// says Ready.
	if res := e.ApplyStage(ctx, &planOf("1").Stages[0], owner); res.State == capstanv1.StageFailed {
		t.Fatal(res.Err)
	}
	for _, m := range machines {
		typ, _, _ := unstructured.NestedString(m.Object, "spec", "type")
		items, err := json.Marshal(map[string]any{"spec": map[string]any{"stateItems": lcmItems(typ, "1")}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Patch(ctx, m.DeepCopy(), client.RawPatch(types.MergePatchType, items)); err != nil {
			t.Fatal(err)
		}
		play(t, c, m, statusStep(map[string]any{"state": "Ready", "hostname": m.GetName(), "observedGeneration": int64(2)}))
	}

	d, err := e.DiffPlan(ctx, planOf("2"), owner, stages.DiffOptions{NewRevision: true})
	if err != nil {
		t.Fatal(err)
	}
	rollouts := d.Rollouts()
	if len(rollouts) != 1 {
		t.Fatalf("rollouts = %+v, want one", rollouts)
	}
	r := rollouts[0]
	if want := []string{"release: r-1 -> r-2", "machineTypes.manager: new StateItems", "machineTypes.worker: new StateItems"}; !slices.Equal(r.Changes, want) {
		t.Errorf("changes = %q, want %q", r.Changes, want)
	}
	var got []string
	for _, b := range r.Batches {
		s := b.Stage + " " + b.Phase + " " + b.Type + " " + strings.Join(b.Machines, ",")
		if b.Drain {
			s += " drain"
		}
		got = append(got, s)
	}
	want := []string{
		"MachinesPrepared prepare  m-0,m-1,w-0,w-1,w-2,w-3",
		"ManagersDeployed deploy manager m-0",
		"ManagersDeployed deploy manager m-1",
		"FirstWorkerDeployed deploy worker w-0 drain",
		"WorkersDeployed deploy worker w-1,w-2 drain",
		"WorkersDeployed deploy worker w-3 drain",
	}
	if !slices.Equal(got, want) {
		t.Errorf("batches:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(r.Strategy, "workers at most 2 at once") {
		t.Errorf("strategy = %q", r.Strategy)
	}
	for _, s := range d.Stages {
		if s.Action == capstanv1.StageActionRollout && !s.Works {
			t.Errorf("rollout stage %s does not work: %q", s.Name, s.Why)
		}
	}
}

// FieldDiffs is a pure function; these rows pin how it reads.
func TestFieldDiffs(t *testing.T) {
	cm := func(data map[string]any, extra map[string]any) *unstructured.Unstructured {
		obj := configMap("ns", "c", data)
		for k, v := range extra {
			obj.Object[k] = v
		}
		return obj
	}
	for _, tc := range []struct {
		name        string
		live, apply *unstructured.Unstructured
		want        []string
	}{
		{
			name:  "server-kept metadata and status are left out",
			live:  withMeta(cm(map[string]any{"a": "1"}, map[string]any{"status": map[string]any{"x": "1"}})),
			apply: cm(map[string]any{"a": "1"}, nil),
		},
		{
			name:  "lists of named items are matched by name",
			live:  cm(nil, map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "app", "image": "a:1"}, map[string]any{"name": "side", "image": "s:1"}}}}),
			apply: cm(nil, map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "side", "image": "s:1"}, map[string]any{"name": "app", "image": "a:2"}}}}),
			want:  []string{"spec.containers[name=app].image: a:1 -> a:2"},
		},
		{
			name:  "other lists item by item",
			live:  cm(nil, map[string]any{"spec": map[string]any{"hosts": []any{"a", "b"}}}),
			apply: cm(nil, map[string]any{"spec": map[string]any{"hosts": []any{"a", "c", "d"}}}),
			want:  []string{"spec.hosts[1]: b -> c", "spec.hosts[2]: (none) -> d"},
		},
		{
			name:  "strings that would read as another type are quoted, long ones shortened",
			live:  cm(map[string]any{"n": "1", "t": "yes", "long": strings.Repeat("x", 100)}, nil),
			apply: cm(map[string]any{"n": "true", "t": "a b", "long": strings.Repeat("y", 100)}, nil),
			want:  []string{"data.long: " + strings.Repeat("x", 71) + "… -> " + strings.Repeat("y", 71) + "…", `data.n: "1" -> "true"`, "data.t: yes -> a b"},
		},
		{
			name:  "maps in a list are shown as compact JSON when added",
			live:  cm(nil, map[string]any{"spec": map[string]any{}}),
			apply: cm(nil, map[string]any{"spec": map[string]any{"taints": []any{map[string]any{"key": "k", "effect": "NoSchedule"}}}}),
			want:  []string{`spec.taints: (none) -> [{"effect":"NoSchedule","key":"k"}]`},
		},
		{
			name:  "a Secret's data and kubectl's copy of it are redacted",
			live:  withAnnotation(secret("ns", "s", map[string]string{"a": plantedSecret, "b": "same"}), "kubectl.kubernetes.io/last-applied-configuration", plantedSecret),
			apply: withAnnotation(secret("ns", "s", map[string]string{"b": "same", "c": plantedSecret}), "kubectl.kubernetes.io/last-applied-configuration", "{}"),
			want:  []string{"data.a: (removed)", "data.c: (added)", "metadata.annotations.kubectl.kubernetes.io/last-applied-configuration: (changed)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, f := range stages.FieldDiffs(tc.live, tc.apply) {
				got = append(got, f.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func withMeta(obj *unstructured.Unstructured) *unstructured.Unstructured {
	obj.SetResourceVersion("42")
	obj.SetGeneration(3)
	obj.SetUID("0000")
	obj.SetManagedFields(nil)
	return obj
}

func withAnnotation(obj *unstructured.Unstructured, k, v string) *unstructured.Unstructured {
	obj.SetAnnotations(map[string]string{k: v})
	return obj
}

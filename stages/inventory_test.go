package stages_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/stages"
)

func entries(ids ...string) []capstanv1.InventoryEntry {
	out := make([]capstanv1.InventoryEntry, len(ids))
	for i, id := range ids {
		out[i] = capstanv1.InventoryEntry{ID: id, Version: "v1"}
	}
	return out
}

func inventoryNames(inv *capstanv1.Inventory) []string {
	var names []string
	for _, s := range inv.Stages {
		names = append(names, s.Name)
	}
	return names
}

func TestMergeInventoryKeepsPlanOrderAndOldEntries(t *testing.T) {
	order := []string{"A", "B", "C"}
	inv := &capstanv1.Inventory{}
	stages.MergeInventory(inv, capstanv1.InventoryStage{Name: "C", Entries: entries("ns_c__ConfigMap")}, order)
	stages.MergeInventory(inv, capstanv1.InventoryStage{Name: "A", Entries: entries("ns_a__ConfigMap")}, order)
	// A stage the plan no longer has keeps its place.
	inv.Stages = slices.Insert(inv.Stages, 1, capstanv1.InventoryStage{Name: "Gone", Entries: entries("ns_g__ConfigMap")})
	stages.MergeInventory(inv, capstanv1.InventoryStage{Name: "B", Entries: entries("ns_b__ConfigMap")}, order)
	if got, want := inventoryNames(inv), []string{"A", "Gone", "B", "C"}; !slices.Equal(got, want) {
		t.Errorf("stages = %v, want %v", got, want)
	}
	stages.MergeInventory(inv, capstanv1.InventoryStage{Name: "A", Entries: entries("ns_a2__ConfigMap")}, order)
	if got := inv.Stages[0].Entries; len(got) != 2 || got[0].ID != "ns_a2__ConfigMap" || got[1].ID != "ns_a__ConfigMap" {
		t.Errorf("stage A entries = %v, want the new and the old entry, sorted", got)
	}
}

func TestStaleFindsWhatThePlanDropped(t *testing.T) {
	inv := &capstanv1.Inventory{Stages: []capstanv1.InventoryStage{
		{Name: "A", Entries: entries("ns_keep__ConfigMap", "ns_drop__ConfigMap")},
		{Name: "Removed", Entries: entries("ns_moved__ConfigMap", "ns_old__ConfigMap")},
	}}
	plan := &stages.Plan{Stages: []stages.Stage{
		{StageSpec: capstanv1.StageSpec{Name: "A"}, Objects: []*unstructured.Unstructured{configMap("ns", "keep", nil)}},
		// An object that moved to another stage is not stale.
		{StageSpec: capstanv1.StageSpec{Name: "B"}, Objects: []*unstructured.Unstructured{configMap("ns", "moved", nil)}},
	}}
	stale := stages.Stale(inv, plan)
	var got []string
	for _, s := range stale {
		for _, e := range s.Entries {
			got = append(got, s.Name+":"+e.ID)
		}
	}
	want := []string{"A:ns_drop__ConfigMap", "Removed:ns_old__ConfigMap"}
	if !slices.Equal(got, want) {
		t.Errorf("stale = %v, want %v", got, want)
	}
	stages.RemoveFromInventory(inv, map[string]bool{"ns_old__ConfigMap": true, "ns_moved__ConfigMap": true})
	if got, want := inventoryNames(inv), []string{"A"}; !slices.Equal(got, want) {
		t.Errorf("after removing every entry of Removed, stages = %v, want %v", got, want)
	}
}

// installDeploymentCRD serves ClusterDeployments in the test control
// plane, so that owner labels can name deployments that exist.
func installDeploymentCRD(t *testing.T, c client.WithWatch) {
	t.Helper()
	raw, err := os.ReadFile("../manifests/crds/capstan.dev_clusterdeployments.yaml")
	if err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &crd.Object); err != nil {
		t.Fatal(err)
	}
	if _, err := stages.NewExecutor(c).Apply(testContext(t), []*unstructured.Unstructured{crd}, "CRDs", stages.Owner{Name: "crds", Namespace: "capstan-system"}); err != nil {
		t.Fatal(err)
	}
}

func createDeployment(t *testing.T, c client.Client, o stages.Owner) *unstructured.Unstructured {
	t.Helper()
	cd := object("capstan.dev/v1alpha1", "ClusterDeployment", o.Namespace, o.Name)
	cd.Object["spec"] = map[string]any{"path": "./"}
	if err := c.Create(testContext(t), cd); err != nil {
		t.Fatal(err)
	}
	return cd
}

func TestApplyRefusesAnotherDeploymentsObject(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	installDeploymentCRD(t, c)
	e := stages.NewExecutor(c)
	first := stages.Owner{Name: "first", Namespace: ns}
	second := stages.Owner{Name: "second", Namespace: ns}
	cdFirst := createDeployment(t, c, first)

	if _, err := e.Apply(ctx, []*unstructured.Unstructured{configMap(ns, "shared", map[string]any{"by": "first"})}, "Config", first); err != nil {
		t.Fatal(err)
	}
	mark := log.mark()
	_, err := e.Apply(ctx, []*unstructured.Unstructured{
		configMap(ns, "own", map[string]any{"by": "second"}),
		configMap(ns, "shared", map[string]any{"by": "second"}),
	}, "Config", second)
	if err == nil || !stages.IsStalled(err) {
		t.Fatalf("apply of another deployment's object: err = %v, want a stalled conflict", err)
	}
	for _, want := range []string{"ConfigMap/" + ns + "/shared", ns + "/first", ns + "/second"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if writes := log.writesSince(mark, false); len(writes) > 0 {
		t.Errorf("a stage with a conflict wrote: %v", writes)
	}
	live := getLive(t, c, configMap(ns, "shared", nil))
	if live.GetLabels()[stages.OwnerNameLabel] != "first" || live.Object["data"].(map[string]any)["by"] != "first" {
		t.Errorf("the first deployment's object changed: %v", live.Object)
	}

	// Once the first deployment is gone (deleted with deletionPolicy
	// Orphan), its objects are free to take.
	if err := c.Delete(ctx, cdFirst); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Apply(ctx, []*unstructured.Unstructured{configMap(ns, "shared", map[string]any{"by": "second"})}, "Config", second); err != nil {
		t.Fatalf("take over the object of a deleted deployment: %v", err)
	}
	if got := getLive(t, c, configMap(ns, "shared", nil)).GetLabels()[stages.OwnerNameLabel]; got != "second" {
		t.Errorf("owner label = %q, want second", got)
	}
}

func TestApplyAdoptsOnlyWhatItMay(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	create := func(obj *unstructured.Unstructured) {
		t.Helper()
		if err := c.Create(ctx, obj.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	create(configMap(ns, "same", map[string]any{"k": "v"}))
	create(configMap(ns, "differs", map[string]any{"k": "v"}))
	secret := object("v1", "Secret", ns, "creds")
	secret.Object["stringData"] = map[string]any{"password": "s3cr3t-adopt"}
	create(secret)

	if _, err := e.Apply(ctx, []*unstructured.Unstructured{configMap(ns, "same", map[string]any{"k": "v"})}, "Config", owner); err != nil {
		t.Errorf("adopt an object the source declares as it is: %v", err)
	}
	_, err := e.Apply(ctx, []*unstructured.Unstructured{configMap(ns, "differs", map[string]any{"k": "other"})}, "Config", owner)
	if err == nil || !stages.IsStalled(err) || !strings.Contains(err.Error(), stages.AdoptAnnotation) {
		t.Errorf("overwrite an object Capstan did not apply: err = %v, want stalled, naming %s", err, stages.AdoptAnnotation)
	}
	marked := configMap(ns, "differs", map[string]any{"k": "other"})
	marked.SetAnnotations(map[string]string{stages.AdoptAnnotation: "true"})
	if _, err := e.Apply(ctx, []*unstructured.Unstructured{marked}, "Config", owner); err != nil {
		t.Errorf("adopt an object the source marks: %v", err)
	}

	sameSecret := object("v1", "Secret", ns, "creds")
	sameSecret.Object["stringData"] = map[string]any{"password": "s3cr3t-adopt"}
	_, err = e.Apply(ctx, []*unstructured.Unstructured{sameSecret}, "Config", owner)
	if err == nil || !stages.IsStalled(err) {
		t.Errorf("adopt a Secret silently: err = %v, want stalled", err)
	} else if strings.Contains(err.Error(), "s3cr3t-adopt") {
		t.Errorf("the error quotes the Secret's value: %v", err)
	}
	sameSecret.SetAnnotations(map[string]string{stages.AdoptAnnotation: "true"})
	if _, err := e.Apply(ctx, []*unstructured.Unstructured{sameSecret}, "Config", owner); err != nil {
		t.Errorf("adopt a Secret the source marks: %v", err)
	}
}

func TestPrune(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	nsName := "prune-" + ns
	gone := configMap(ns, "gone", map[string]any{"k": "v"})
	kept := configMap(ns, "kept", map[string]any{"k": "v"})
	kept.SetLabels(map[string]string{stages.PruneKey: "disabled"})
	taken := configMap(ns, "taken", map[string]any{"k": "v"})
	namespace := object("v1", "Namespace", "", nsName)
	objs := []*unstructured.Unstructured{gone, kept, taken, namespace}
	if _, err := e.Apply(ctx, objs, "Config", owner); err != nil {
		t.Fatal(err)
	}
	// Another deployment takes one over (its first was deleted): not this
	// one's to prune any more.
	if _, err := e.Apply(ctx, []*unstructured.Unstructured{taken}, "Other", stages.Owner{Name: "other", Namespace: ns}); err != nil {
		t.Fatal(err)
	}
	inv := e.InventoryOf(&stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Config"}, Objects: append(objs, configMap(ns, "never-there", nil))})

	res, err := e.Prune(ctx, inv.Entries, owner, stages.PruneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := func(obj *unstructured.Unstructured) string { return stages.ObjectID(obj) }
	check := func(what string, got []string, want ...string) {
		t.Helper()
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	check("kept", res.Kept, id(kept))
	check("held", res.Held, id(namespace))
	check("gone or not ours", res.Gone, id(taken), id(configMap(ns, "never-there", nil)))
	if len(res.Deleting) == 1 {
		check("deleting", res.Deleting, id(gone))
	} else {
		t.Errorf("deleting = %v, want only %s", res.Deleting, id(gone))
	}
	for _, obj := range []*unstructured.Unstructured{kept, taken, namespace} {
		getLive(t, c, obj)
	}
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(gone.GroupVersionKind())
	if err := c.Get(ctx, client.ObjectKeyFromObject(gone), live); !apierrors.IsNotFound(err) {
		t.Errorf("pruned ConfigMap still there: %v", err)
	}

	// Destructive kinds go only when the deployment allows it.
	res, err = e.Prune(ctx, entries(id(namespace)), owner, stages.PruneOptions{Destructive: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deleting) != 1 {
		t.Errorf("with destructive pruning allowed, deleting = %v, want the Namespace", res.Deleting)
	}
}

// A prune or a deletion never deletes what would take Capstan or other
// deployments with it, whatever spec.prune allows: a Namespace that holds
// a ClusterDeployment, the Namespace Capstan runs in, a CRD of Capstan's
// API group. They leave the inventory, saying why; a Namespace holding
// nothing of that kind goes as before.
func TestPruneNeverDeletesWhatCapstanLivesOn(t *testing.T) {
	ctx := testContext(t)
	if err := testenv.InstallCRDs(ctx, env.Config, "../manifests/crds/capstan.dev_clusterdeployments.yaml"); err != nil {
		t.Fatal(err)
	}
	c, _ := newClient(t)
	suffix := newNamespace(t)
	holding, home, plain := "holds-"+suffix, "home-"+suffix, "plain-"+suffix
	e := stages.NewExecutor(c, stages.WithHomeNamespace(home))
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: probes`+suffix+`.capstan.dev}
spec:
  group: capstan.dev
  names: {kind: Probe`+suffix+`, listKind: Probe`+suffix+`List, plural: probes`+suffix+`, singular: probe`+suffix+`}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]
`), &crd.Object); err != nil {
		t.Fatal(err)
	}
	objs := []*unstructured.Unstructured{object("v1", "Namespace", "", holding), object("v1", "Namespace", "", home),
		object("v1", "Namespace", "", plain), crd}
	if _, err := e.Apply(ctx, objs, "Config", owner); err != nil {
		t.Fatal(err)
	}
	cd := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"path": "app"}}}
	cd.SetGroupVersionKind(capstanv1.GroupVersion.WithKind("ClusterDeployment"))
	cd.SetNamespace(holding)
	cd.SetName("tenant")
	if err := c.Create(ctx, cd); err != nil {
		t.Fatal(err)
	}
	inv := e.InventoryOf(&stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Config"}, Objects: objs})

	res, err := e.Prune(ctx, inv.Entries, owner, stages.PruneOptions{Destructive: true})
	if err != nil {
		t.Fatal(err)
	}
	for obj, want := range map[*unstructured.Unstructured]string{
		objs[0]: "holds ClusterDeployment " + holding + "/tenant",
		objs[1]: "Capstan runs in it",
		crd:     "it defines Capstan's API",
	} {
		if why := res.Protected[stages.ObjectID(obj)]; !strings.Contains(why, want) {
			t.Errorf("%s: protected because %q, want it kept saying %q", stages.ObjectRef(obj), why, want)
		}
		if live := getLive(t, c, obj); live.GetDeletionTimestamp() != nil {
			t.Errorf("%s is being deleted", stages.ObjectRef(obj))
		}
	}
	if !slices.Equal(res.Deleting, []string{stages.ObjectID(objs[2])}) {
		t.Errorf("deleting = %v, want only Namespace %s", res.Deleting, plain)
	}
	// The dry run of a diff says the same.
	look, err := e.Prune(ctx, inv.Entries, owner, stages.PruneOptions{Destructive: true, DryRun: true})
	if err != nil || len(look.Protected) != 3 {
		t.Errorf("dry run: protected %v (%v), want the three", look.Protected, err)
	}
}

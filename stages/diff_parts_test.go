package stages_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// TestDiffPartsComparesWhatItCanReach: a plan over three clusters, the
// home one, one that stops answering and one whose kubeconfig does not
// exist yet. The home stage is compared; the other two list their objects
// as not compared, each with its reason, and so do the objects the
// revision drops from the cluster that does not answer.
func TestDiffPartsComparesWhatItCanReach(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	home, _ := newClient(t)
	plan, err := stages.BuildPlan([]capstanv1.StageSpec{
		{Name: "Home", Action: capstanv1.StageActionApply},
		{Name: "Edge", Action: capstanv1.StageActionApply},
		{Name: "Later", Action: capstanv1.StageActionApply},
	}, []*unstructured.Unstructured{
		staged(configMap(ns, "home", map[string]any{"a": "1"}), "Home"),
		staged(configMap(ns, "edge", map[string]any{"a": "1"}), "Edge"),
		staged(configMap(ns, "later", map[string]any{"a": "1"}), "Later"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Stages[1].Objects) != 1 {
		t.Fatalf("stage Edge selects %d objects, want 1", len(plan.Stages[1].Objects))
	}

	down := directPath(t)
	kc := kubeconfigOf(t)
	for _, cluster := range kc.Clusters {
		cluster.Server = down.config.Host
	}
	data, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	edge, err := stages.NewKubeconfigCluster("Secret "+ns+"/edge-kubeconfig", data, scheme.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	down.cut()
	edgeExec := stages.NewExecutor(home).On(edge)

	inv := &capstanv1.Inventory{Stages: []capstanv1.InventoryStage{{
		Name: "Edge", KubeConfig: &capstanv1.SecretKeyReference{Name: "edge-kubeconfig"}, KubeConfigNamespace: ns,
		Entries: []capstanv1.InventoryEntry{{ID: ns + "_gone__ConfigMap", Version: "v1"}},
	}}}
	d, err := stages.DiffParts(ctx, plan, stages.Owner{Name: "parts", Namespace: ns}, stages.DiffOptions{Inventory: inv}, []stages.PlanPart{
		{Stages: []int{0}, Executor: stages.NewExecutor(home), Home: true},
		{Stages: []int{1}, Executor: edgeExec, Cluster: "Secret " + ns + "/edge-kubeconfig"},
		{Stages: []int{2}, Cluster: "Secret " + ns + "/later-kubeconfig", NotCompared: "the kubeconfig Secret does not exist"},
	}, func(capstanv1.InventoryStage) (*stages.Executor, error) { return edgeExec, nil })
	if err != nil {
		t.Fatalf("DiffParts: %v, want the unreachable cluster's stages not compared, not an error", err)
	}
	if got := d.Stages[0]; got.Objects[0].Action != stages.DiffCreate || got.NotCompared != "" || got.Cluster != "" {
		t.Errorf("stage Home = %+v, want its ConfigMap created, compared here", got)
	}
	for i, why := range map[int]string{1: "edge-kubeconfig unreachable", 2: "the kubeconfig Secret does not exist"} {
		got := d.Stages[i]
		if !strings.Contains(got.NotCompared, why) || got.Objects[0].Action != stages.DiffNotCompared || !strings.HasPrefix(got.Why, "not compared") {
			t.Errorf("stage %s = %+v, want its object not compared because %q", got.Name, got, why)
		}
	}
	if len(d.Prune) != 1 || d.Prune[0].Action != stages.DiffNotCompared || d.Prune[0].Ref != "ConfigMap/"+ns+"/gone" {
		t.Errorf("prune = %+v, want ConfigMap/%s/gone not compared", d.Prune, ns)
	}
	if !d.Unanswered || !d.Changes() || d.Counts().NotCompared != 3 {
		t.Errorf("Unanswered %v, Changes %v, %d not compared; want true, true, 3", d.Unanswered, d.Changes(), d.Counts().NotCompared)
	}
}

// staged labels obj into stage.
func staged(obj *unstructured.Unstructured, stage string) *unstructured.Unstructured {
	obj.SetLabels(map[string]string{stages.StageKey: stage})
	return obj
}

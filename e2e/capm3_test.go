package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/sim"
	"github.com/capstan-dev/capstan/stages"
)

// capm3Kinds are the kinds the mgmt example commits, with the index of the
// capm3 stage that applies them.
var capm3Kinds = []struct {
	gvk   schema.GroupVersionKind
	stage int
}{
	{schema.GroupVersionKind{Version: "v1", Kind: "Secret"}, 0},
	{schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, 0},
	{schema.GroupVersionKind{Group: "metal3.io", Version: "v1alpha1", Kind: "BareMetalHost"}, 0},
	{schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Cluster"}, 1},
	{schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "Metal3Cluster"}, 1},
	{schema.GroupVersionKind{Group: "ipam.metal3.io", Version: "v1alpha1", Kind: "IPPool"}, 1},
	{schema.GroupVersionKind{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta2", Kind: "KubeadmControlPlane"}, 2},
	{schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "Metal3MachineTemplate"}, 2},
	{schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "Metal3DataTemplate"}, 2},
	{schema.GroupVersionKind{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta2", Kind: "KubeadmConfigTemplate"}, 2},
	{schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "MachineDeployment"}, 4},
}

// exampleMgmt commits the mgmt example (its overlay and the Metal3 base)
// to a new repository, moved into namespace ns, and returns its
// ClusterDeployment reading that repository.
func exampleMgmt(t *testing.T, ns string) *capstanv1.ClusterDeployment {
	t.Helper()
	c := newClient(t)
	files := map[string]string{}
	for _, dir := range []string{"bases/metal3-cluster", "clusters/mgmt/overlay", "clusters/mgmt/upgrade"} {
		entries, err := os.ReadDir(filepath.Join("..", "examples", dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			content, err := os.ReadFile(filepath.Join("..", "examples", dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			files[dir+"/"+e.Name()] = string(content)
		}
	}
	files["clusters/mgmt/overlay/kustomization.yaml"] = strings.Replace(files["clusters/mgmt/overlay/kustomization.yaml"], "namespace: mgmt", "namespace: "+ns, 1)
	files["clusters/mgmt/upgrade/kustomization.yaml"] = strings.Replace(files["clusters/mgmt/upgrade/kustomization.yaml"], "namespace: mgmt", "namespace: "+ns, 1)
	files["clusters/mgmt/overlay/namespace.yaml"] = strings.Replace(files["clusters/mgmt/overlay/namespace.yaml"], "name: mgmt", "name: "+ns, 1)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "the mgmt example"); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("../examples/clusters/mgmt/clusterdeployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cd := &capstanv1.ClusterDeployment{}
	if err := yaml.UnmarshalStrict(raw, cd); err != nil {
		t.Fatalf("examples/clusters/mgmt/clusterdeployment.yaml: %v", err)
	}
	cd.Namespace = ns
	// Its BMC credentials are encrypted for the demo key.
	createDemoKeySecret(t, c, ns)
	cd.Spec.Source = &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
		URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(t, c, ns)},
	}}
	return cd
}

// creations records, from watches opened before anything is applied, the
// order in which Capstan creates the objects of one deployment: by the
// resource version of each object's ADDED event, which etcd hands out in
// commit order.
type creations struct {
	mu    sync.Mutex
	added map[string]int64 // "Kind/name" -> resource version at creation
	stage map[string]int   // "Kind/name" -> index of the stage applying it
}

func recordCreations(t *testing.T, ns, deployment string) *creations {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &creations{added: map[string]int64{}, stage: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, k := range capm3Kinds {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(k.gvk.GroupVersion().WithKind(k.gvk.Kind + "List"))
		w, err := c.Watch(ctx, list, client.InNamespace(ns), client.MatchingLabels{stages.OwnerGroup + "/name": deployment})
		if err != nil {
			t.Fatalf("watch %s: %v", k.gvk.Kind, err)
		}
		go func() {
			defer w.Stop()
			for ev := range w.ResultChan() {
				obj, ok := ev.Object.(*unstructured.Unstructured)
				if !ok || ev.Type != watch.Added {
					continue
				}
				rv, _ := strconv.ParseInt(obj.GetResourceVersion(), 10, 64)
				key := k.gvk.Kind + "/" + obj.GetName()
				rec.mu.Lock()
				if _, seen := rec.added[key]; !seen {
					rec.added[key], rec.stage[key] = rv, k.stage
				}
				rec.mu.Unlock()
			}
		}()
	}
	return rec
}

// order returns the recorded objects in creation order.
func (r *creations) order() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(r.added))
	for k := range r.added {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return r.added[keys[i]] < r.added[keys[j]] })
	return keys
}

// stageWatch follows a deployment's status and fails the test if any
// stage ever starts while an earlier one is not Ready. It returns the
// order in which stages became Ready.
type stageWatch struct {
	mu         sync.Mutex
	readyOrder []string
	violations []string
}

func watchStages(t *testing.T, ns, name string) *stageWatch {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: newClient(t).Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := c.Watch(ctx, &capstanv1.ClusterDeploymentList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	sw := &stageWatch{}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			cd, ok := ev.Object.(*capstanv1.ClusterDeployment)
			if !ok || cd.Name != name {
				continue
			}
			sw.observe(cd)
		}
	}()
	return sw
}

func (sw *stageWatch) observe(cd *capstanv1.ClusterDeployment) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	blocked := ""
	for _, st := range cd.Status.Stages {
		if blocked != "" && st.State != capstanv1.StagePending {
			sw.violations = append(sw.violations, fmt.Sprintf("%s is %s while %s is not Ready", st.Name, st.State, blocked))
		}
		if st.State == capstanv1.StageReady && !slices.Contains(sw.readyOrder, st.Name) {
			sw.readyOrder = append(sw.readyOrder, st.Name)
		}
		if st.State != capstanv1.StageReady && blocked == "" {
			blocked = st.Name
		}
	}
}

// The examples/ management cluster goes through every capm3 stage to
// ClusterReady on the simulated providers, with the real Cluster API,
// CAPM3, BareMetal Operator and IPAM CRDs: the stages finish in the
// profile's order, none starts before the one ahead of it is Ready, and
// Capstan creates every object only in its own stage.
func TestCapm3ExampleReachesClusterReadyInOrder(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	cd := exampleMgmt(t, ns)
	rec := recordCreations(t, ns, cd.Name)
	sw := watchStages(t, ns, cd.Name)
	startSimulator(t, sim.TestOptions(ns))
	startDaemon(t, nil)

	begin := time.Now()
	if err := c.Create(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	done := waitDeployment(t, c, ns, cd.Name, "Ready", isReady)
	t.Logf("mgmt example: created -> Ready in %s (%s)", time.Since(begin).Round(time.Millisecond), stageDurations(done))

	profile, err := stages.LoadProfile("capm3")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, s := range profile.Stages {
		want = append(want, s.Name)
	}
	sw.mu.Lock()
	if !slices.Equal(sw.readyOrder, want) {
		t.Errorf("stages became Ready in the order %v, want the profile's %v", sw.readyOrder, want)
	}
	for _, v := range sw.violations {
		t.Errorf("stage order broken: %s", v)
	}
	sw.mu.Unlock()

	order := rec.order()
	if len(order) != 20 { // 5 Secrets, 1 ConfigMap, 5 hosts, 3 + 5 + 1 objects of later stages
		t.Errorf("recorded %d created objects, want 20: %v", len(order), order)
	}
	last := 0
	for _, key := range order {
		if s := rec.stage[key]; s < last {
			t.Errorf("creation order %v: %s (stage %d) created after an object of stage %d", order, key, s, last)
		} else {
			last = s
		}
	}
	t.Logf("creation order: %v", order)
}

// A host that never leaves provisioning holds its stage InProgress: the
// stage retries, turns stuck after its stuckAfter, and its message names
// the host. Clearing the fault lets it finish.
func TestCapm3StuckHostIsNamedThenRecovers(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	cd := exampleMgmt(t, ns)
	specs, err := stages.StageSpecs(cd.Spec)
	if err != nil {
		t.Fatal(err)
	}
	for i := range specs {
		specs[i].StuckAfter = nil
		if specs[i].Name == "ControlPlaneInitialized" {
			specs[i].StuckAfter = &metav1.Duration{Duration: 2 * time.Second}
		}
	}
	cd.Spec.Profile, cd.Spec.Stages = "", specs
	opts := sim.TestOptions(ns)
	// Whichever host the first control-plane machine claims never finishes.
	hosts := []string{"mgmt-cp-0", "mgmt-cp-1", "mgmt-cp-2"}
	opts.Faults = map[string]sim.Fault{}
	for _, h := range hosts {
		opts.Faults[h] = sim.FaultStuckProvisioning
	}
	s := startSimulator(t, opts)
	startDaemon(t, nil)
	if err := c.Create(context.Background(), cd); err != nil {
		t.Fatal(err)
	}

	stuck := waitDeployment(t, c, ns, cd.Name, "ControlPlaneInitialized stuck", func(cd *capstanv1.ClusterDeployment) bool {
		st := stage(cd, "ControlPlaneInitialized")
		return st.State == capstanv1.StageInProgress && st.Stuck
	})
	st := stage(stuck, "ControlPlaneInitialized")
	t.Logf("stuck stage message: %s", st.Message)
	if !strings.Contains(st.Message, "BareMetalHost") || !strings.Contains(st.Message, "mgmt-cp-") {
		t.Errorf("stuck stage message = %q, want it to name the provisioning host", st.Message)
	}
	if st.Attempts != 1 {
		t.Errorf("stuck stage attempts = %d, want 1: a stage that waits makes no new attempt", st.Attempts)
	}
	if isReady(stuck) || condition(stuck, capstanv1.ConditionStalled).Status == "True" {
		t.Errorf("a stuck stage must keep the deployment progressing, not Ready nor Stalled: %s", describe(stuck))
	}

	for _, h := range hosts {
		s.ClearFault(h)
	}
	done := waitDeployment(t, c, ns, cd.Name, "Ready after the fault is cleared", isReady)
	if stage(done, "ControlPlaneInitialized").Stuck {
		t.Errorf("ControlPlaneInitialized still stuck once Ready")
	}
}

// startSimulator runs the provider simulator until the test ends.
func startSimulator(t *testing.T, opts sim.Options) *sim.Simulator {
	t.Helper()
	s, err := sim.New(env.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("simulator: %v", err)
		}
	})
	return s
}

func stageDurations(cd *capstanv1.ClusterDeployment) string {
	var parts []string
	for _, st := range cd.Status.Stages {
		if st.StartedAt != nil && st.FinishedAt != nil {
			parts = append(parts, fmt.Sprintf("%s %s", st.Name, st.FinishedAt.Sub(st.StartedAt.Time)))
		}
	}
	return strings.Join(parts, ", ")
}

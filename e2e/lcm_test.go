package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/sim"
	"github.com/capstan-dev/capstan/reconciler"
)

var (
	lcmMachineGVK = lcmv1.GroupVersion.WithKind(lcmv1.LCMMachineKind)
	lcmClusterGVK = lcmv1.GroupVersion.WithKind(lcmv1.LCMClusterKind)
)

// lcmFiles is an overlay of an LCM cluster at one release: an LCMCluster,
// its machines (no spec.stateItems: the rollout writes them) and the
// helm-controller's settings, which must wait for a manager and a worker.
func lcmFiles(version string, managers, workers int) map[string]string {
	items := func(t string) string {
		return fmt.Sprintf(`
      - {name: download, phase: prepare, runner: downloader, version: "%[1]s"}
      - {name: join-%[2]s, phase: deploy, runner: ansible, version: "%[1]s"}
      - {name: managers, phase: reconfigure, runner: ansible, version: "%[1]s"}`, version, t)
	}
	var machines strings.Builder
	for i := range managers {
		fmt.Fprintf(&machines, "---\napiVersion: lcm.capstan.dev/v1alpha1\nkind: LCMMachine\nmetadata: {name: manager-%d, namespace: \"${NS}\"}\nspec: {type: manager, clusterName: east}\n", i)
	}
	for i := range workers {
		fmt.Fprintf(&machines, "---\napiVersion: lcm.capstan.dev/v1alpha1\nkind: LCMMachine\nmetadata: {name: worker-%03d, namespace: \"${NS}\"}\nspec: {type: worker, clusterName: east}\n", i)
	}
	return map[string]string{
		"clusters/lcm/kustomization.yaml": "resources: [cluster.yaml, machines.yaml, helm-controller.yaml]\n",
		"clusters/lcm/cluster.yaml": `apiVersion: lcm.capstan.dev/v1alpha1
kind: LCMCluster
metadata: {name: east, namespace: "${NS}"}
spec:
  release: capstan-` + version + `
  kubernetesVersion: v1.35.4
  machineTypes:
    manager:` + items("manager") + `
    worker:` + items("worker") + "\n",
		"clusters/lcm/machines.yaml": machines.String(),
		"clusters/lcm/helm-controller.yaml": `apiVersion: v1
kind: ConfigMap
metadata:
  name: helm-controller
  namespace: "${NS}"
  labels: {capstan.dev/component: helm-controller}
data: {release: "` + version + `"}
`,
	}
}

func lcmSpec(url, ns, secret string) capstanv1.ClusterDeploymentSpec {
	return capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, Ref: capstanv1.GitRef{Branch: "main"},
			SecretRef: &capstanv1.LocalObjectReference{Name: secret},
		}},
		Path:       "clusters/lcm",
		Substitute: map[string]string{"NS": ns},
		Interval:   &metav1.Duration{Duration: 500 * time.Millisecond},
		Profile:    "lcm",
	}
}

func newWatchClient(t testing.TB) client.WithWatch {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startLCMAgent plays the agents of the namespace's machines until the
// test ends, and removes the Nodes they registered.
func startLCMAgent(t *testing.T, ns string) {
	t.Helper()
	c := newWatchClient(t)
	opts := sim.DefaultLCMOptions()
	opts.Namespace = ns
	opts.ItemDelay = 5 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sim.NewLCMAgent(c, opts).Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("LCM agent: %v", err)
		}
		err := c.DeleteAllOf(context.Background(), &corev1.Node{}, client.MatchingLabels{sim.LCMNodeNamespaceLabel: ns})
		if err != nil {
			t.Errorf("delete the Nodes of %s: %v", ns, err)
		}
	})
}

// lcmEvent is one watch event of the test's timeline.
type lcmEvent struct {
	rv     uint64
	kind   string
	typ    watch.EventType
	object *unstructured.Unstructured
}

// lcmTimeline records the watch events of the LCMMachines, ConfigMaps
// and Pods of a namespace and of the Nodes of its machines. All of them
// live in the one etcd of the test control plane, whose revision orders
// every write: sorted by resourceVersion, the events of different kinds
// replay in the order the writes happened. (A test-only shortcut: a
// client may not compare resource versions in general.)
type lcmTimeline struct {
	mu     sync.Mutex
	events []lcmEvent
	// gap is set when a watch could not resume where it stopped.
	gap error
}

func recordLCM(t *testing.T, c client.WithWatch, ns string) *lcmTimeline {
	t.Helper()
	tl := &lcmTimeline{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	follow := func(gvk schema.GroupVersionKind, opts ...client.ListOption) {
		listGVK := gvk.GroupVersion().WithKind(gvk.Kind + "List")
		start := &unstructured.UnstructuredList{}
		start.SetGroupVersionKind(listGVK)
		if err := c.List(ctx, start, append(opts, client.Limit(1))...); err != nil {
			t.Fatalf("list %s: %v", gvk.Kind, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The API server closes a watch that falls behind a burst of
			// events; the next one resumes at the last event seen, so the
			// timeline has no gap.
			rv := start.GetResourceVersion()
			for ctx.Err() == nil {
				list := &unstructured.UnstructuredList{}
				list.SetGroupVersionKind(listGVK)
				w, err := c.Watch(ctx, list, append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})...)
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				for ev := range w.ResultChan() {
					if ev.Type == watch.Error {
						if err := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
							tl.mu.Lock()
							tl.gap = fmt.Errorf("watch %s: %w", gvk.Kind, err)
							tl.mu.Unlock()
							w.Stop()
							return
						}
						break
					}
					u, ok := ev.Object.(*unstructured.Unstructured)
					if !ok {
						continue
					}
					rv = u.GetResourceVersion()
					n, err := strconv.ParseUint(rv, 10, 64)
					if err != nil || ev.Type == watch.Bookmark {
						continue
					}
					tl.mu.Lock()
					tl.events = append(tl.events, lcmEvent{rv: n, kind: gvk.Kind, typ: ev.Type, object: u})
					tl.mu.Unlock()
				}
				w.Stop()
			}
		}()
	}
	follow(lcmMachineGVK, client.InNamespace(ns))
	follow(configMapGVK, client.InNamespace(ns))
	follow(corev1.SchemeGroupVersion.WithKind("Pod"), client.InNamespace(ns))
	follow(corev1.SchemeGroupVersion.WithKind("Node"), client.MatchingLabels{sim.LCMNodeNamespaceLabel: ns})
	return tl
}

// sorted returns the events recorded so far in the order of the writes.
func (tl *lcmTimeline) sorted() []lcmEvent {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	out := slices.Clone(tl.events)
	sort.SliceStable(out, func(i, j int) bool { return out[i].rv < out[j].rv })
	return out
}

// until waits until the recorded events, in write order, satisfy done:
// the watches deliver a moment after the writes, and each at its pace.
func (tl *lcmTimeline) until(t *testing.T, what string, done func([]lcmEvent) bool) []lcmEvent {
	t.Helper()
	var events []lcmEvent
	waitFor(t, "the timeline to hold "+what, func() (bool, error) {
		tl.mu.Lock()
		gap := tl.gap
		tl.mu.Unlock()
		if gap != nil {
			t.Fatalf("the timeline has a gap: %v", gap)
		}
		events = tl.sorted()
		if done(events) {
			return true, nil
		}
		states := map[lcmv1.MachineState]int{}
		for _, m := range lastMachines(t, events) {
			states[m.Status.State]++
		}
		return false, fmt.Errorf("%d events, machines %v", len(events), states)
	})
	return events
}

// lastMachines replays the LCMMachine events: each machine as last seen.
func lastMachines(t *testing.T, events []lcmEvent) map[string]*lcmv1.LCMMachine {
	out := map[string]*lcmv1.LCMMachine{}
	for _, ev := range events {
		if ev.kind == lcmv1.LCMMachineKind {
			m := toMachine(t, ev.object)
			out[m.Name] = m
		}
	}
	return out
}

func toMachine(t *testing.T, u *unstructured.Unstructured) *lcmv1.LCMMachine {
	t.Helper()
	m := &lcmv1.LCMMachine{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, m); err != nil {
		t.Fatal(err)
	}
	return m
}

func listMachines(t *testing.T, c client.Client, ns string) []*lcmv1.LCMMachine {
	t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(lcmv1.GroupVersion.WithKind("LCMMachineList"))
	if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []*lcmv1.LCMMachine
	for i := range list.Items {
		out = append(out, toMachine(t, &list.Items[i]))
	}
	return out
}

// A new LCM cluster of 3 managers and 120 workers, from git, with the lcm
// profile and the agents simulated: the managers deploy strictly one at a
// time, the workers only after them, the first worker alone, the others
// never more than 50 at once (and more than one: in batches), and the
// helm-controller's objects appear only once a manager and a worker are
// Ready. The daemon is replaced while the workers deploy: the new one
// carries on from what the cluster says, hands no machine its items
// twice, and keeps to the batch.
func TestLCMDeployOrderAndBatches(t *testing.T) {
	const managers, workers, batch = 3, 120, 50
	c := newClient(t)
	wc := newWatchClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, lcmFiles("1.0.0", managers, workers), "lcm cluster east"); err != nil {
		t.Fatal(err)
	}
	timeline := recordLCM(t, wc, ns)
	startLCMAgent(t, ns)
	first, _ := startDaemon(t, nil)
	begin := time.Now()
	createDeployment(t, c, ns, "east", lcmSpec(url, ns, gitSecret(t, c, ns)))
	waitDeployment(t, c, ns, "east", "the workers deploying", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "WorkersDeployed").State == capstanv1.StageInProgress
	})
	stopDaemon(first)
	startDaemon(t, nil)
	cd := waitDeployment(t, c, ns, "east", "Ready", isReady)
	t.Logf("%d managers and %d workers deployed in %s", managers, workers, time.Since(begin).Round(time.Millisecond))
	for _, st := range cd.Status.Stages {
		if st.State != capstanv1.StageReady {
			t.Errorf("stage %s = %s, want Ready", st.Name, st.State)
		}
	}
	// Each rollout stage counted its machines, to the last.
	for name, want := range map[string]string{
		"MachinesPrepared":    fmt.Sprintf("%d/%d machines prepared", managers+workers, managers+workers),
		"ManagersDeployed":    fmt.Sprintf("%d/%d managers ready", managers, managers),
		"FirstWorkerDeployed": "1/1 workers ready",
		"WorkersDeployed":     fmt.Sprintf("%d/%d workers ready", workers, workers),
	} {
		if got := stage(cd, name).Progress.String(); got != want {
			t.Errorf("stage %s progress %q, want %q", name, got, want)
		}
	}

	// Replay every write in order.
	state := map[string]*lcmv1.LCMMachine{}
	count := func(t lcmv1.MachineType, s lcmv1.MachineState) int {
		n := 0
		for _, m := range state {
			if m.Spec.Type == t && m.Status.State == s {
				n++
			}
		}
		return n
	}
	maxWorkers, helmSeen := 0, false
	events := timeline.until(t, "every machine Ready and the helm-controller ConfigMap", func(events []lcmEvent) bool {
		ready := 0
		for _, m := range lastMachines(t, events) {
			if m.Status.State == lcmv1.MachineStateReady {
				ready++
			}
		}
		return ready == managers+workers && slices.ContainsFunc(events, func(e lcmEvent) bool { return e.kind == "ConfigMap" && e.object.GetName() == "helm-controller" })
	})
	for _, ev := range events {
		switch {
		case ev.kind == "ConfigMap" && ev.object.GetName() == "helm-controller" && !helmSeen:
			helmSeen = true
			if m, w := count(lcmv1.MachineTypeManager, lcmv1.MachineStateReady), count(lcmv1.MachineTypeWorker, lcmv1.MachineStateReady); m < 1 || w < 1 {
				t.Errorf("helm-controller ConfigMap created with %d managers and %d workers Ready, want at least one of each", m, w)
			}
		case ev.kind == lcmv1.LCMMachineKind:
			m := toMachine(t, ev.object)
			state[m.Name] = m
			mDeploy, wDeploy := count(lcmv1.MachineTypeManager, lcmv1.MachineStateDeploy), count(lcmv1.MachineTypeWorker, lcmv1.MachineStateDeploy)
			if mDeploy > 1 {
				t.Fatalf("at resourceVersion %d, %d managers are in Deploy at once, want one at a time", ev.rv, mDeploy)
			}
			if wDeploy > batch {
				t.Fatalf("at resourceVersion %d, %d workers are in Deploy at once, want at most %d", ev.rv, wDeploy, batch)
			}
			if wDeploy > 0 && count(lcmv1.MachineTypeManager, lcmv1.MachineStateReady) < managers {
				t.Fatalf("at resourceVersion %d, a worker is in Deploy before every manager is Ready", ev.rv)
			}
			if wDeploy > 1 && count(lcmv1.MachineTypeWorker, lcmv1.MachineStateReady) == 0 {
				t.Fatalf("at resourceVersion %d, %d workers are in Deploy before the first one is Ready", ev.rv, wDeploy)
			}
			maxWorkers = max(maxWorkers, wDeploy)
		}
	}
	if !helmSeen {
		t.Error("the timeline has no helm-controller ConfigMap")
	}
	if maxWorkers < 2 {
		t.Errorf("at most %d workers were in Deploy at once: no batching happened", maxWorkers)
	}
	t.Logf("at most %d workers were in Deploy at once (batch %d)", maxWorkers, batch)
	if n := count(lcmv1.MachineTypeManager, lcmv1.MachineStateReady) + count(lcmv1.MachineTypeWorker, lcmv1.MachineStateReady); n != managers+workers {
		t.Errorf("%d machines Ready at the end of the timeline, want %d", n, managers+workers)
	}

	// Each machine's spec changed twice (prepare items, then all items) and
	// its agent ran each item once.
	for _, m := range listMachines(t, c, ns) {
		if m.Generation != 3 {
			t.Errorf("%s is at generation %d, want 3: created, prepare items, all items", m.Name, m.Generation)
		}
		for _, r := range m.Status.StateItemResults {
			if r.Attempts != 1 || r.State != lcmv1.StateItemSucceeded {
				t.Errorf("%s: %s %s after %d attempts, want Succeeded after 1", m.Name, r.Name, r.State, r.Attempts)
			}
		}
	}

	// The rollout reports on the LCMCluster.
	lc := object(t, c, lcmClusterGVK, ns, "east")
	var cluster lcmv1.LCMCluster
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(lc.Object, &cluster); err != nil {
		t.Fatal(err)
	}
	want := lcmv1.LCMClusterStatus{Release: "capstan-1.0.0", Managers: lcmv1.MachineCounts{Total: managers, Ready: managers}, Workers: lcmv1.MachineCounts{Total: workers, Ready: workers}}
	if got := cluster.Status; got.Release != want.Release || got.Managers != want.Managers || got.Workers != want.Workers || got.ObservedGeneration != cluster.Generation {
		t.Errorf("LCMCluster status = %+v, want release %s, managers %+v, workers %+v at generation %d", got, want.Release, want.Managers, want.Workers, cluster.Generation)
	}
}

// webPod is a pod of the test's workload, pinned to a node. Its grace
// period is zero: with no kubelet, an evicted pod is deleted at once.
func webPod(ns, name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers:                    []corev1.Container{{Name: "web", Image: "registry.invalid/web:1"}},
		},
	}
}

// runReadyPod creates a pod and plays its kubelet: Running and Ready, so
// that the disruption controller counts it healthy.
func runReadyPod(t *testing.T, c client.Client, pod *corev1.Pod) {
	t.Helper()
	// A fresh namespace gets its default ServiceAccount a moment after it
	// is created; pods are refused until then.
	waitFor(t, "create "+pod.Name, func() (bool, error) {
		err := c.Create(context.Background(), pod.DeepCopy())
		return err == nil || apierrors.IsAlreadyExists(err), err
	})
	if err := setPodReady(context.Background(), c, pod.Namespace, pod.Name); err != nil {
		t.Fatal(err)
	}
}

func setPodReady(ctx context.Context, c client.Client, ns, name string) error {
	pod := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pod); err != nil {
		return err
	}
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	return c.Status().Update(ctx, pod)
}

// replaceEvicted plays the workload's ReplicaSet: each web pod that goes
// is replaced by a Ready one on node, until the test ends.
func replaceEvicted(t *testing.T, c client.WithWatch, ns, node string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := c.Watch(ctx, &corev1.PodList{}, client.InNamespace(ns), client.MatchingLabels{"app": "web"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
	go func() {
		defer close(done)
		n := 0
		for ev := range w.ResultChan() {
			if ev.Type != watch.Deleted {
				continue
			}
			n++
			pod := webPod(ns, fmt.Sprintf("web-r%d", n), node)
			if err := c.Create(ctx, pod); err != nil {
				if ctx.Err() == nil {
					t.Errorf("replace an evicted pod: %v", err)
				}
				return
			}
			if err := setPodReady(ctx, c, ns, pod.Name); err != nil && ctx.Err() == nil {
				t.Errorf("replace an evicted pod: %v", err)
			}
		}
	}()
}

func budget(t *testing.T, c client.Client, ns string) *policyv1.PodDisruptionBudget {
	t.Helper()
	pdb := &policyv1.PodDisruptionBudget{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web"}, pdb); err != nil {
		t.Fatal(err)
	}
	return pdb
}

func workerItemsAt(m *lcmv1.LCMMachine, version string) bool {
	return slices.ContainsFunc(m.Spec.StateItems, func(i lcmv1.StateItem) bool {
		return i.Phase == lcmv1.StatePhaseDeploy && i.Version == version
	})
}

// An upgrade of a deployed cluster (1 manager, 3 workers with a pod
// each): every worker's Node is cordoned and its pod evicted before the
// worker gets its new items, a PodDisruptionBudget that allows no
// disruption holds the first drain (the stage says which budget and pod),
// and once relaxed the upgrade finishes with every Node uncordoned.
func TestLCMUpgradeDrainsWorkersHonouringBudgets(t *testing.T) {
	c := newClient(t)
	wc := newWatchClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, lcmFiles("1.0.0", 1, 3), "lcm cluster east"); err != nil {
		t.Fatal(err)
	}
	timeline := recordLCM(t, wc, ns)
	startLCMAgent(t, ns)
	startDaemon(t, nil)
	createDeployment(t, c, ns, "east", lcmSpec(url, ns, gitSecret(t, c, ns)))
	waitDeployment(t, c, ns, "east", "Ready at 1.0.0", isReady)

	// A workload: one Ready pod per worker, and a budget that allows no
	// disruption.
	nodeOf := map[string]string{}
	for _, m := range listMachines(t, c, ns) {
		nodeOf[m.Name] = m.Status.Hostname
	}
	podsOn := map[string][]string{}
	for i := range 3 {
		worker := fmt.Sprintf("worker-%03d", i)
		pod := webPod(ns, fmt.Sprintf("web-%d", i), nodeOf[worker])
		runReadyPod(t, c, pod)
		podsOn[nodeOf[worker]] = append(podsOn[nodeOf[worker]], pod.Name)
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(3)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		},
	}
	if err := c.Create(context.Background(), pdb); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the disruption controller to count 3 healthy pods", func() (bool, error) {
		pdb := budget(t, c, ns)
		return pdb.Status.ObservedGeneration == pdb.Generation && pdb.Status.CurrentHealthy == 3 && pdb.Status.DisruptionsAllowed == 0, nil
	})
	replaceEvicted(t, wc, ns, nodeOf["manager-0"])

	// The upgrade: new versions of every item.
	second, err := gitSrv.Commit(ns, gitserver.DefaultBranch, lcmFiles("2.0.0", 1, 3), "upgrade east to 2.0.0")
	if err != nil {
		t.Fatal(err)
	}
	cd := waitDeployment(t, c, ns, "east", "the first worker's drain held by the budget", func(cd *capstanv1.ClusterDeployment) bool {
		st := stage(cd, "FirstWorkerDeployed")
		return cd.Status.Revision == "main@sha1:"+second && st.State == capstanv1.StageInProgress &&
			strings.Contains(st.Message, "PodDisruptionBudget "+ns+"/web") && strings.Contains(st.Message, "Pod/"+ns+"/web-0")
	})
	t.Logf("held: %s", stage(cd, "FirstWorkerDeployed").Message)
	for _, name := range []string{"LCMObjectsCreated", "MachinesPrepared", "ManagersDeployed"} {
		if st := stage(cd, name); st.State != capstanv1.StageReady {
			t.Errorf("stage %s = %s while the first worker drains, want Ready", name, st.State)
		}
	}
	for _, m := range listMachines(t, c, ns) {
		if m.Spec.Type == lcmv1.MachineTypeWorker && workerItemsAt(m, "2.0.0") {
			t.Errorf("%s got its new items while the budget allows no eviction", m.Name)
		}
	}
	node := &corev1.Node{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: nodeOf["worker-000"]}, node); err != nil {
		t.Fatal(err)
	}
	if !node.Spec.Unschedulable {
		t.Errorf("Node %s is schedulable while it is being drained", node.Name)
	}
	if pod := (&corev1.Pod{}); c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web-0"}, pod) != nil {
		t.Error("web-0 is gone though its budget allows no disruption")
	}

	// Relax the budget: one pod may be down at a time. The evicted pods
	// come back on the manager, and the drains go on one by one.
	pdb = budget(t, c, ns)
	pdb.Spec.MinAvailable = ptr.To(intstr.FromInt32(2))
	if err := c.Update(context.Background(), pdb); err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c, ns, "east", "Ready at 2.0.0", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Revision == "main@sha1:"+second && isReady(cd)
	})

	// The end: every machine Ready at 2.0.0, every Node schedulable and
	// unmarked.
	for _, m := range listMachines(t, c, ns) {
		if m.Status.State != lcmv1.MachineStateReady || !workerItemsAt(m, "2.0.0") {
			t.Errorf("%s: state %s, items %+v; want Ready at 2.0.0", m.Name, m.Status.State, m.Spec.StateItems)
		}
		node := &corev1.Node{}
		if err := c.Get(context.Background(), client.ObjectKey{Name: m.Status.Hostname}, node); err != nil {
			t.Fatal(err)
		}
		if node.Spec.Unschedulable || node.Annotations["capstan.dev/drain"] != "" {
			t.Errorf("Node %s: unschedulable %v, annotations %v after the upgrade; want it back in service", node.Name, node.Spec.Unschedulable, node.Annotations)
		}
	}

	// Replay: per worker, cordon < its pods deleted < new items < Ready
	// at the new items < uncordon; the manager is never cordoned.
	type history struct{ cordoned, itemsSet, ready, uncordoned uint64 }
	hist := map[string]*history{}  // by node
	deleted := map[string]uint64{} // pod -> rv
	events := timeline.until(t, "the upgrade to its end", func(events []lcmEvent) bool {
		for _, m := range lastMachines(t, events) {
			if !workerItemsAt(m, "2.0.0") || m.Status.State != lcmv1.MachineStateReady || m.Status.ObservedGeneration != m.Generation {
				return false
			}
		}
		schedulable := map[string]bool{}
		gone := 0
		for _, ev := range events {
			switch {
			case ev.kind == "Node":
				u, _, _ := unstructured.NestedBool(ev.object.Object, "spec", "unschedulable")
				schedulable[ev.object.GetName()] = !u
			case ev.kind == "Pod" && ev.typ == watch.Deleted && strings.HasPrefix(ev.object.GetName(), "web-") && !strings.HasPrefix(ev.object.GetName(), "web-r"):
				gone++
			}
		}
		for _, node := range nodeOf {
			if !schedulable[node] {
				return false
			}
		}
		return gone == 3
	})
	for _, ev := range events {
		switch ev.kind {
		case "Node":
			unschedulable, _, _ := unstructured.NestedBool(ev.object.Object, "spec", "unschedulable")
			h := hist[ev.object.GetName()]
			if h == nil {
				h = &history{}
				hist[ev.object.GetName()] = h
			}
			if unschedulable && h.cordoned == 0 {
				h.cordoned = ev.rv
			}
			if !unschedulable && h.cordoned != 0 && h.uncordoned == 0 {
				h.uncordoned = ev.rv
			}
		case "Pod":
			if ev.typ == watch.Deleted {
				deleted[ev.object.GetName()] = ev.rv
			}
		case lcmv1.LCMMachineKind:
			m := toMachine(t, ev.object)
			h := hist[m.Status.Hostname]
			if h == nil || !workerItemsAt(m, "2.0.0") {
				continue
			}
			if h.itemsSet == 0 {
				h.itemsSet = ev.rv
			}
			if h.ready == 0 && m.Status.State == lcmv1.MachineStateReady && m.Status.ObservedGeneration == m.Generation {
				h.ready = ev.rv
			}
		}
	}
	for name, node := range nodeOf {
		h := hist[node]
		if h == nil {
			t.Errorf("no Node events for %s", name)
			continue
		}
		if strings.HasPrefix(name, "manager") {
			if h.cordoned != 0 {
				t.Errorf("manager %s was cordoned; managers are upgraded one at a time without a drain", name)
			}
			continue
		}
		switch {
		case h.cordoned == 0 || h.itemsSet == 0 || h.ready == 0 || h.uncordoned == 0:
			t.Errorf("%s: history %+v, want cordon, new items, Ready and uncordon", name, *h)
		case !(h.cordoned < h.itemsSet && h.itemsSet < h.ready && h.ready < h.uncordoned):
			t.Errorf("%s: cordoned at %d, new items at %d, Ready at %d, uncordoned at %d; want them in that order", name, h.cordoned, h.itemsSet, h.ready, h.uncordoned)
		}
		for _, pod := range podsOn[node] {
			if at, ok := deleted[pod]; !ok || at > h.itemsSet {
				t.Errorf("%s: pod %s evicted at %d, new items set at %d; want the pod gone first", name, pod, at, h.itemsSet)
			}
		}
	}
}

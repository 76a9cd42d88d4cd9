package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// lcmItems is a release's StateItems for one machine type.
func lcmItems(version string, reconfigure string) []lcmv1.StateItem {
	items := []lcmv1.StateItem{
		{Name: "download", Phase: lcmv1.StatePhasePrepare, Runner: "downloader", Version: version},
		{Name: "join", Phase: lcmv1.StatePhaseDeploy, Runner: "ansible", Version: version},
	}
	if reconfigure != "" {
		items = append(items, lcmv1.StateItem{Name: "managers", Phase: lcmv1.StatePhaseReconfigure, Runner: "ansible", Version: reconfigure})
	}
	return items
}

func lcmPrepareOnly(items []lcmv1.StateItem) []lcmv1.StateItem {
	return slices.DeleteFunc(slices.Clone(items), func(i lcmv1.StateItem) bool { return i.Phase != lcmv1.StatePhasePrepare })
}

// TestLCMWorkingState pins which state the agent reports for which work.
func TestLCMWorkingState(t *testing.T) {
	prepare := lcmv1.StateItem{Name: "download", Phase: lcmv1.StatePhasePrepare}
	deploy := lcmv1.StateItem{Name: "join", Phase: lcmv1.StatePhaseDeploy}
	reconfigure := lcmv1.StateItem{Name: "managers", Phase: lcmv1.StatePhaseReconfigure}
	deployedResult := lcmv1.StateItemResult{Name: "join", Phase: lcmv1.StatePhaseDeploy, State: lcmv1.StateItemSucceeded}
	cases := []struct {
		name    string
		state   lcmv1.MachineState
		results []lcmv1.StateItemResult
		pending []lcmv1.StateItem
		want    lcmv1.MachineState
	}{
		{"prepare items alone are Prepare", lcmv1.MachineStatePending, nil, []lcmv1.StateItem{prepare}, lcmv1.MachineStatePrepare},
		{"a Ready machine fetching a new release is Prepare", lcmv1.MachineStateReady, []lcmv1.StateItemResult{deployedResult}, []lcmv1.StateItem{prepare}, lcmv1.MachineStatePrepare},
		{"deploy items on a machine never deployed are Deploy", lcmv1.MachineStatePending, nil, []lcmv1.StateItem{prepare, deploy}, lcmv1.MachineStateDeploy},
		{"a first deployment stays Deploy though an item succeeded", lcmv1.MachineStateDeploy, []lcmv1.StateItemResult{deployedResult}, []lcmv1.StateItem{deploy}, lcmv1.MachineStateDeploy},
		{"deploy items on a Ready machine are Upgrade", lcmv1.MachineStateReady, []lcmv1.StateItemResult{deployedResult}, []lcmv1.StateItem{deploy}, lcmv1.MachineStateUpgrade},
		{"deploy items after a prepare of a deployed machine are Upgrade", lcmv1.MachineStatePrepare, []lcmv1.StateItemResult{deployedResult}, []lcmv1.StateItem{deploy}, lcmv1.MachineStateUpgrade},
		{"reconfigure items on a Ready machine are Reconfigure", lcmv1.MachineStateReady, []lcmv1.StateItemResult{deployedResult}, []lcmv1.StateItem{reconfigure}, lcmv1.MachineStateReconfigure},
		{"reconfigure items on a new machine are part of its Deploy", lcmv1.MachineStatePending, nil, []lcmv1.StateItem{reconfigure}, lcmv1.MachineStateDeploy},
		{"a deployment stays Deploy through its reconfigure items", lcmv1.MachineStateDeploy, []lcmv1.StateItemResult{deployedResult}, []lcmv1.StateItem{reconfigure}, lcmv1.MachineStateDeploy},
		{"an upgrade stays Upgrade through its reconfigure items", lcmv1.MachineStateUpgrade, []lcmv1.StateItemResult{deployedResult}, []lcmv1.StateItem{reconfigure}, lcmv1.MachineStateUpgrade},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &lcmv1.LCMMachine{Status: lcmv1.LCMMachineStatus{State: tc.state, StateItemResults: tc.results}}
			if got := lcmWorkingState(m, tc.pending); got != tc.want {
				t.Errorf("state = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestLCMAgent runs the agent against a real API server: registration,
// prepare, deploy, upgrade, reconfigure, the injected faults and a restart.
// It shares the package's control plane (sharedEnv).
func TestLCMAgent(t *testing.T) {
	env := sharedEnv(t)
	t.Run("Lifecycle", func(t *testing.T) { lcmTestLifecycle(t, env) })
	t.Run("Faults", func(t *testing.T) { lcmTestFaults(t, env) })
	t.Run("Restart", func(t *testing.T) { lcmTestRestart(t, env) })
}

type lcmFixture struct {
	t  *testing.T
	c  client.WithWatch
	ns string
	// states records, per machine, the states the watch saw, without repeats.
	mu     sync.Mutex
	states map[string][]lcmv1.MachineState
	// results records every item result the watch saw, per machine and item.
	results map[string][]lcmv1.StateItemResult
}

func lcmNewFixture(t *testing.T, env *testenv.Env) *lcmFixture {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(t.Context(), "lcm")
	if err != nil {
		t.Fatal(err)
	}
	f := &lcmFixture{t: t, c: c, ns: ns, states: map[string][]lcmv1.MachineState{}, results: map[string][]lcmv1.StateItemResult{}}
	f.record()
	return f
}

// record follows the namespace's machines for the rest of the test.
func (f *lcmFixture) record() {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(lcmMachineListGVK)
	w, err := f.c.Watch(f.t.Context(), list, client.InNamespace(f.ns))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(w.Stop)
	go func() {
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			m := &lcmv1.LCMMachine{}
			if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, m) != nil {
				continue
			}
			f.mu.Lock()
			if s := f.states[m.Name]; m.Status.State != "" && (len(s) == 0 || s[len(s)-1] != m.Status.State) {
				f.states[m.Name] = append(s, m.Status.State)
			}
			f.results[m.Name] = append(f.results[m.Name], m.Status.StateItemResults...)
			f.mu.Unlock()
		}
	}()
}

func (f *lcmFixture) statesOf(name string) []lcmv1.MachineState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.states[name])
}

func (f *lcmFixture) resultsOf(name string) []lcmv1.StateItemResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.results[name])
}

func (f *lcmFixture) create(name string, typ lcmv1.MachineType, cluster string) {
	f.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": lcmv1.GroupVersion.String(), "kind": lcmv1.LCMMachineKind,
		"metadata": map[string]any{"name": name, "namespace": f.ns},
		"spec":     map[string]any{"type": string(typ), "clusterName": cluster},
	}}
	if err := f.c.Create(f.t.Context(), u); err != nil {
		f.t.Fatal(err)
	}
}

// setItems plays the rollout: it writes the machine's spec.stateItems.
func (f *lcmFixture) setItems(name string, items []lcmv1.StateItem) {
	f.t.Helper()
	data, err := json.Marshal(map[string]any{"spec": map[string]any{"stateItems": items}})
	if err != nil {
		f.t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(lcmv1.GroupVersion.WithKind(lcmv1.LCMMachineKind))
	u.SetNamespace(f.ns)
	u.SetName(name)
	if err := f.c.Patch(f.t.Context(), u, client.RawPatch(types.MergePatchType, data)); err != nil {
		f.t.Fatal(err)
	}
}

func (f *lcmFixture) get(name string) *lcmv1.LCMMachine {
	f.t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(lcmv1.GroupVersion.WithKind(lcmv1.LCMMachineKind))
	if err := f.c.Get(f.t.Context(), client.ObjectKey{Namespace: f.ns, Name: name}, u); err != nil {
		f.t.Fatal(err)
	}
	m := &lcmv1.LCMMachine{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, m); err != nil {
		f.t.Fatal(err)
	}
	return m
}

// waitMachine waits until cond holds for the machine; the agent is driven
// by watch events, the test only observes it.
func (f *lcmFixture) waitMachine(name, what string, cond func(*lcmv1.LCMMachine) bool) *lcmv1.LCMMachine {
	f.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		m := f.get(name)
		if cond(m) {
			return m
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("LCMMachine %s: timed out waiting for %s; status %+v", name, what, m.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lcmSettledAt holds when the agent has run every item of the current spec
// and reports want.
func lcmSettledAt(want lcmv1.MachineState) func(*lcmv1.LCMMachine) bool {
	return func(m *lcmv1.LCMMachine) bool {
		return m.Status.ObservedGeneration == m.Generation && m.Status.State == want && len(m.PendingItems()) == 0
	}
}

func (f *lcmFixture) startAgent(opts LCMOptions) (stop func()) {
	f.t.Helper()
	opts.Namespace = f.ns
	ctx, cancel := context.WithCancel(f.t.Context())
	done := make(chan error, 1)
	go func() { done <- NewLCMAgent(f.c, opts).Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			f.t.Errorf("agent: %v", err)
		}
	}
	f.t.Cleanup(stop)
	return stop
}

func lcmTestLifecycle(t *testing.T, env *testenv.Env) {
	f := lcmNewFixture(t, env)
	f.create("manager-0", lcmv1.MachineTypeManager, "east")
	f.create("worker-0", lcmv1.MachineTypeWorker, "east")
	f.create("spare", lcmv1.MachineTypeWorker, "")
	f.startAgent(DefaultLCMOptions())

	// Registration: hostname, address, Pending, and a Ready Node.
	for _, name := range []string{"manager-0", "worker-0"} {
		m := f.waitMachine(name, "Pending", lcmSettledAt(lcmv1.MachineStatePending))
		if m.Status.Hostname != name+"."+f.ns || m.Status.IP == "" {
			t.Errorf("%s: hostname %q, ip %q; want %s.%s and an address", name, m.Status.Hostname, m.Status.IP, name, f.ns)
		}
		node := &corev1.Node{}
		if err := f.c.Get(t.Context(), client.ObjectKey{Name: m.Status.Hostname}, node); err != nil {
			t.Fatalf("%s: no Node %s: %v", name, m.Status.Hostname, err)
		}
		if node.Labels[LCMNodeMachineLabel] != name || node.Labels[LCMNodeNamespaceLabel] != f.ns {
			t.Errorf("Node %s labels = %v, want them to name LCMMachine %s/%s", node.Name, node.Labels, f.ns, name)
		}
		if !slices.ContainsFunc(node.Status.Conditions, func(c corev1.NodeCondition) bool {
			return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
		}) {
			t.Errorf("Node %s conditions = %v, want Ready True", node.Name, node.Status.Conditions)
		}
	}
	f.waitMachine("spare", "Uninitialized", lcmSettledAt(lcmv1.MachineStateUninitialized))

	// Prepare alone leaves the machine Pending with its results Succeeded.
	v1 := lcmItems("1.0.0", "")
	f.setItems("worker-0", lcmPrepareOnly(v1))
	m := f.waitMachine("worker-0", "prepared", func(m *lcmv1.LCMMachine) bool {
		return lcmSettledAt(lcmv1.MachineStatePending)(m) && len(m.Status.StateItemResults) == 1
	})
	if r := m.Status.StateItemResults[0]; r.State != lcmv1.StateItemSucceeded || r.Attempts != 1 || r.StartedAt == nil || r.FinishedAt == nil || r.ExitCode == nil || *r.ExitCode != 0 {
		t.Errorf("prepare result = %+v, want Succeeded after one attempt, with times and exit code 0", r)
	}

	// Deploy, then an upgrade, then a reconfiguration.
	f.setItems("worker-0", v1)
	f.setItems("manager-0", v1)
	f.waitMachine("worker-0", "Ready", lcmSettledAt(lcmv1.MachineStateReady))
	f.waitMachine("manager-0", "Ready", lcmSettledAt(lcmv1.MachineStateReady))
	f.setItems("worker-0", lcmItems("2.0.0", ""))
	f.waitMachine("worker-0", "Ready at 2.0.0", lcmSettledAt(lcmv1.MachineStateReady))
	f.setItems("worker-0", lcmItems("2.0.0", "3-managers"))
	m = f.waitMachine("worker-0", "Ready after reconfiguration", lcmSettledAt(lcmv1.MachineStateReady))
	for _, r := range m.Status.StateItemResults {
		if r.State != lcmv1.StateItemSucceeded {
			t.Errorf("result %+v, want Succeeded", r)
		}
	}

	want := []lcmv1.MachineState{
		lcmv1.MachineStatePending, lcmv1.MachineStatePrepare, lcmv1.MachineStatePending,
		lcmv1.MachineStateDeploy, lcmv1.MachineStateReady,
		lcmv1.MachineStateUpgrade, lcmv1.MachineStateReady,
		lcmv1.MachineStateReconfigure, lcmv1.MachineStateReady,
	}
	lcmWaitStates(t, f, "worker-0", want)
	lcmWaitStates(t, f, "manager-0", []lcmv1.MachineState{
		lcmv1.MachineStatePending, lcmv1.MachineStateDeploy, lcmv1.MachineStateReady,
	})
	if got := f.get("spare").Status; got.Hostname != "" {
		t.Errorf("unassigned machine got hostname %q, want none", got.Hostname)
	}
}

// lcmWaitStates waits until the recorded states of a machine are want: the
// watch may deliver the last event a moment after the status is read.
func lcmWaitStates(t *testing.T, f *lcmFixture, name string, want []lcmv1.MachineState) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(f.statesOf(name), want) {
		if time.Now().After(deadline) {
			t.Errorf("%s went through %v, want %v", name, f.statesOf(name), want)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func lcmTestFaults(t *testing.T, env *testenv.Env) {
	f := lcmNewFixture(t, env)
	f.create("stuck", lcmv1.MachineTypeWorker, "east")
	f.create("flaky", lcmv1.MachineTypeWorker, "east")
	opts := DefaultLCMOptions()
	opts.StuckInDeploy = []string{"stuck"}
	opts.FailOnce = []string{"flaky/join"}
	f.startAgent(opts)
	f.waitMachine("stuck", "Pending", lcmSettledAt(lcmv1.MachineStatePending))
	f.waitMachine("flaky", "Pending", lcmSettledAt(lcmv1.MachineStatePending))
	v1 := lcmItems("1.0.0", "")
	f.setItems("stuck", v1)
	f.setItems("flaky", v1)

	// The flaky machine's join fails once, then succeeds on its second run.
	m := f.waitMachine("flaky", "Ready", lcmSettledAt(lcmv1.MachineStateReady))
	join, _ := m.Result("join")
	if join.State != lcmv1.StateItemSucceeded || join.Attempts != 2 {
		t.Errorf("flaky join result = %+v, want Succeeded at attempt 2", join)
	}
	if !slices.ContainsFunc(f.resultsOf("flaky"), func(r lcmv1.StateItemResult) bool {
		return r.Name == "join" && r.State == lcmv1.StateItemFailed && r.Attempts == 1 && r.ExitCode != nil && *r.ExitCode == 1
	}) {
		t.Errorf("flaky join was never reported Failed at attempt 1 with exit code 1: %+v", f.resultsOf("flaky"))
	}

	// The stuck machine stays in Deploy with its join Running, even while
	// the flaky one finished long after it started.
	m = f.waitMachine("stuck", "join Running", func(m *lcmv1.LCMMachine) bool {
		r, ok := m.Result("join")
		return ok && r.State == lcmv1.StateItemRunning && m.Status.State == lcmv1.MachineStateDeploy
	})
	if r, _ := m.Result("download"); r.State != lcmv1.StateItemSucceeded {
		t.Errorf("stuck machine's prepare item = %+v, want Succeeded (only deploy items hang)", r)
	}
	// A new spec wakes it, and it is stuck again at the new version.
	f.setItems("stuck", lcmItems("1.0.1", ""))
	f.waitMachine("stuck", "join 1.0.1 Running", func(m *lcmv1.LCMMachine) bool {
		r, ok := m.Result("join")
		return ok && r.Version == "1.0.1" && r.State == lcmv1.StateItemRunning && m.Status.State == lcmv1.MachineStateDeploy
	})
}

func lcmTestRestart(t *testing.T, env *testenv.Env) {
	f := lcmNewFixture(t, env)
	const machines = 20
	for i := range machines {
		f.create(fmt.Sprintf("worker-%02d", i), lcmv1.MachineTypeWorker, "east")
	}
	opts := DefaultLCMOptions()
	opts.ItemDelay = 2 * time.Second
	stop := f.startAgent(opts)
	for i := range machines {
		f.waitMachine(fmt.Sprintf("worker-%02d", i), "Pending", lcmSettledAt(lcmv1.MachineStatePending))
	}
	v1 := lcmItems("1.0.0", "")
	for i := range machines {
		f.setItems(fmt.Sprintf("worker-%02d", i), v1)
	}
	// Stop the agent while the machines are at work (the last one given
	// items has an item running), start another one.
	f.waitMachine(fmt.Sprintf("worker-%02d", machines-1), "at work", func(m *lcmv1.LCMMachine) bool {
		return slices.ContainsFunc(m.Status.StateItemResults, func(r lcmv1.StateItemResult) bool { return r.State == lcmv1.StateItemRunning })
	})
	stop()
	f.startAgent(DefaultLCMOptions())
	for i := range machines {
		m := f.waitMachine(fmt.Sprintf("worker-%02d", i), "Ready", lcmSettledAt(lcmv1.MachineStateReady))
		for _, r := range m.Status.StateItemResults {
			if r.Attempts != 1 {
				t.Errorf("%s: %s ran %d times, want once: a restarted agent finishes a run, it does not start it again", m.Name, r.Name, r.Attempts)
			}
		}
	}
}

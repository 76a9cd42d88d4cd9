package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
)

// Labels the LCM agent simulator puts on the Node it registers for a
// machine, so that a test finds a machine's Node and the other way round.
const (
	// LCMNodeMachineLabel holds the LCMMachine's name.
	LCMNodeMachineLabel = "lcm.capstan.dev/machine"
	// LCMNodeNamespaceLabel holds the LCMMachine's namespace.
	LCMNodeNamespaceLabel = "lcm.capstan.dev/machine-namespace"
)

// LCMOptions tune the LCM agent simulator.
type LCMOptions struct {
	// Namespace limits the simulator to the LCMMachines of one namespace.
	// Empty means every namespace.
	Namespace string

	// ItemDelay is how long one StateItem runs. Zero runs items at once.
	ItemDelay time.Duration

	// StuckInDeploy names machines (metadata.name) whose deploy items start
	// and never finish: the machine stays in Deploy (or Upgrade) with the
	// item Running until its spec changes, and then is stuck again.
	StuckInDeploy []string

	// FailOnce names StateItems, as "<machine>/<item>", whose first run at
	// each version fails (result Failed, exit code 1); the agent runs them
	// again, and the second run succeeds.
	FailOnce []string
}

// DefaultLCMOptions returns options for a fast, faultless agent on every
// namespace: 20 ms per StateItem.
func DefaultLCMOptions() LCMOptions {
	return LCMOptions{ItemDelay: 20 * time.Millisecond}
}

// LCMAgent plays the LCM agent of every machine: it reports each assigned
// LCMMachine's hostname and address, registers a Ready Node for it, runs
// the StateItems of its spec in order and reports their results and the
// machine's state. It writes LCMMachine status and Nodes, never a spec.
//
// Every step is derived from the machine's status, so a restarted
// simulator carries on where the last one stopped: an item Running at the
// current version is finished, not started again.
//
// After a set of prepare items alone, a machine that was never deployed
// reports Pending again (it waits for its deploy items, with every prepare
// result Succeeded); a deployed machine goes back to Ready.
type LCMAgent struct {
	c    client.WithWatch
	opts LCMOptions

	mu     sync.Mutex
	agents map[types.NamespacedName]*lcmMachineAgent
	wg     sync.WaitGroup
}

// lcmMachineAgent is the goroutine that plays one machine's agent.
type lcmMachineAgent struct {
	wake   chan struct{}
	cancel context.CancelFunc
}

// NewLCMAgent returns a simulator that talks to the cluster through c.
// c's scheme needs the core types (Nodes); LCM objects are read as
// unstructured, so it needs no LCM types.
func NewLCMAgent(c client.WithWatch, opts LCMOptions) *LCMAgent {
	return &LCMAgent{c: c, opts: opts, agents: map[types.NamespacedName]*lcmMachineAgent{}}
}

var lcmMachineListGVK = lcmv1.GroupVersion.WithKind(lcmv1.LCMMachineKind + "List")

// Run plays the agents until ctx ends, then returns nil once every
// machine's goroutine has stopped. It fails only when the cluster does
// not serve the LCMMachine kind; other errors are retried.
func (a *LCMAgent) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		a.wg.Wait()
	}()
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := a.listAndWatch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, lcmErrNotServed) {
			return fmt.Errorf("lcm agent: %w", err)
		}
		if err == nil {
			backoff = 100 * time.Millisecond
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	return nil
}

// lcmErrNotServed ends Run: no retry makes an unknown kind known.
var lcmErrNotServed = errors.New("the cluster does not serve lcm.capstan.dev/v1alpha1 LCMMachine")

// listAndWatch lists the machines, wakes their agents, then follows the
// watch until it ends.
func (a *LCMAgent) listAndWatch(ctx context.Context) error {
	var opts []client.ListOption
	if a.opts.Namespace != "" {
		opts = append(opts, client.InNamespace(a.opts.Namespace))
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(lcmMachineListGVK)
	if err := a.c.List(ctx, list, opts...); err != nil {
		if meta.IsNoMatchError(err) {
			return fmt.Errorf("%w: %v", lcmErrNotServed, err)
		}
		return fmt.Errorf("list LCMMachines: %w", err)
	}
	seen := map[types.NamespacedName]bool{}
	for i := range list.Items {
		key := client.ObjectKeyFromObject(&list.Items[i])
		seen[key] = true
		a.poke(ctx, key)
	}
	a.mu.Lock()
	for key := range a.agents {
		if !seen[key] {
			a.stopLocked(key)
		}
	}
	a.mu.Unlock()

	watchList := &unstructured.UnstructuredList{}
	watchList.SetGroupVersionKind(lcmMachineListGVK)
	w, err := a.c.Watch(ctx, watchList, append(opts, &client.ListOptions{Raw: &metav1.ListOptions{
		ResourceVersion: list.GetResourceVersion(), AllowWatchBookmarks: true,
	}})...)
	if err != nil {
		return fmt.Errorf("watch LCMMachines: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil
			}
			obj, isObj := ev.Object.(*unstructured.Unstructured)
			switch {
			case ev.Type == watch.Error:
				return nil // relist, e.g. after "resource version too old"
			case !isObj || ev.Type == watch.Bookmark:
			case ev.Type == watch.Deleted:
				a.mu.Lock()
				a.stopLocked(client.ObjectKeyFromObject(obj))
				a.mu.Unlock()
			default:
				a.poke(ctx, client.ObjectKeyFromObject(obj))
			}
		}
	}
}

// poke wakes the agent of a machine, starting it first if needed.
func (a *LCMAgent) poke(ctx context.Context, key types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ag, ok := a.agents[key]
	if !ok {
		actx, cancel := context.WithCancel(ctx)
		ag = &lcmMachineAgent{wake: make(chan struct{}, 1), cancel: cancel}
		a.agents[key] = ag
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.play(actx, key, ag.wake)
		}()
	}
	select {
	case ag.wake <- struct{}{}:
	default:
	}
}

func (a *LCMAgent) stopLocked(key types.NamespacedName) {
	if ag, ok := a.agents[key]; ok {
		ag.cancel()
		delete(a.agents, key)
	}
}

// play runs one machine's agent: a step at a time, sleeping until the
// machine changes when there is nothing to do.
func (a *LCMAgent) play(ctx context.Context, key types.NamespacedName, wake <-chan struct{}) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		idle, err := a.step(ctx, key)
		switch {
		case ctx.Err() != nil:
			return
		case apierrors.IsNotFound(err):
			idle = true // deleted: the watch stops this agent
		case err != nil:
			// A write that failed (a conflict, an API server hiccup):
			// try again from what the cluster says.
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		if idle {
			select {
			case <-ctx.Done():
			case <-wake:
			}
		}
	}
}

// step reads the machine and does the next thing its agent would do. It
// reports idle when there is nothing left to do until the machine changes.
func (a *LCMAgent) step(ctx context.Context, key types.NamespacedName) (idle bool, err error) {
	m, err := a.get(ctx, key)
	if err != nil {
		return false, err
	}
	st := m.Status
	st.ObservedGeneration = m.Generation
	switch {
	case m.Spec.ClusterName == "":
		// Not assigned to a cluster: the agent has nothing to report yet.
		if m.Status.State == lcmv1.MachineStateUninitialized && m.Status.ObservedGeneration == m.Generation {
			return true, nil
		}
		st.State = lcmv1.MachineStateUninitialized
		return true, a.writeStatus(ctx, m, st)
	case m.Status.Hostname == "" || m.Status.State == "" || m.Status.State == lcmv1.MachineStateUninitialized:
		st.Hostname, st.IP = lcmHostname(m), lcmAddress(m)
		if err := a.registerNode(ctx, m, st.Hostname, st.IP); err != nil {
			return false, err
		}
		st.State = lcmv1.MachineStatePending
		return false, a.writeStatus(ctx, m, st)
	}

	pending := m.PendingItems()
	if len(pending) == 0 {
		st.State = lcmSettledState(m.Spec.StateItems)
		st.StateItemResults = lcmKeepResults(m)
		if st.State == m.Status.State && m.Status.ObservedGeneration == m.Generation &&
			len(st.StateItemResults) == len(m.Status.StateItemResults) {
			return true, nil
		}
		return true, a.writeStatus(ctx, m, st)
	}

	item := pending[0]
	st.State = lcmWorkingState(m, pending)
	res, running := m.Result(item.Name)
	if !running || res.State != lcmv1.StateItemRunning || res.Version != item.Version {
		// Start a run; attempts count the runs of this version.
		attempts := int32(1)
		if running && res.Version == item.Version {
			attempts = res.Attempts + 1
		}
		now := metav1.Now()
		res = lcmv1.StateItemResult{
			Name: item.Name, Phase: item.Phase, Version: item.Version,
			State: lcmv1.StateItemRunning, Attempts: attempts, StartedAt: &now,
		}
		st.StateItemResults = lcmSetResult(lcmKeepResults(m), res)
		if err := a.writeStatus(ctx, m, st); err != nil {
			return false, err
		}
	}
	if item.Phase == lcmv1.StatePhaseDeploy && slices.Contains(a.opts.StuckInDeploy, m.Name) {
		return true, nil // never finishes; a new spec wakes the agent
	}
	if a.opts.ItemDelay > 0 {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(a.opts.ItemDelay):
		}
	}

	now := metav1.Now()
	res.FinishedAt = &now
	if res.Attempts == 1 && slices.Contains(a.opts.FailOnce, m.Name+"/"+item.Name) {
		res.State, res.ExitCode, res.Message = lcmv1.StateItemFailed, lcmPtr[int32](1), "simulated failure of the first run"
	} else {
		res.State, res.ExitCode, res.Message = lcmv1.StateItemSucceeded, lcmPtr[int32](0), ""
	}
	st.StateItemResults = lcmSetResult(lcmKeepResults(m), res)
	if res.State == lcmv1.StateItemSucceeded && len(pending) == 1 {
		// The last item: report the settled state with its result, as a
		// real agent reports Ready once its last item is done.
		st.State = lcmSettledState(m.Spec.StateItems)
	}
	return false, a.writeStatus(ctx, m, st)
}

func (a *LCMAgent) get(ctx context.Context, key types.NamespacedName) (*lcmv1.LCMMachine, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(lcmv1.GroupVersion.WithKind(lcmv1.LCMMachineKind))
	if err := a.c.Get(ctx, key, u); err != nil {
		return nil, err
	}
	m := &lcmv1.LCMMachine{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, m); err != nil {
		return nil, fmt.Errorf("decode LCMMachine %s: %w", key, err)
	}
	return m, nil
}

// writeStatus replaces the machine's status with st. Lists are replaced
// whole by a merge patch, and every field is written, so nothing of an
// older status survives.
func (a *LCMAgent) writeStatus(ctx context.Context, m *lcmv1.LCMMachine, st lcmv1.LCMMachineStatus) error {
	if st.StateItemResults == nil {
		st.StateItemResults = []lcmv1.StateItemResult{}
	}
	body := map[string]any{"status": map[string]any{
		"observedGeneration": st.ObservedGeneration,
		"state":              st.State,
		"hostname":           st.Hostname,
		"ip":                 st.IP,
		"stateItemResults":   st.StateItemResults,
	}}
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(lcmv1.GroupVersion.WithKind(lcmv1.LCMMachineKind))
	u.SetNamespace(m.Namespace)
	u.SetName(m.Name)
	if err := a.c.Status().Patch(ctx, u, client.RawPatch(types.MergePatchType, data)); err != nil {
		return fmt.Errorf("write status of LCMMachine %s/%s: %w", m.Namespace, m.Name, err)
	}
	return nil
}

// registerNode creates the machine's Node, Ready, as the kubelet would
// once the node joins; an existing Node is left as it is (cordoned, for
// instance).
func (a *LCMAgent) registerNode(ctx context.Context, m *lcmv1.LCMMachine, hostname, ip string) error {
	now := metav1.Now()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: hostname,
			Labels: map[string]string{
				LCMNodeMachineLabel:                              m.Name,
				LCMNodeNamespaceLabel:                            m.Namespace,
				"node-role.kubernetes.io/" + string(m.Spec.Type): "",
			},
		},
	}
	if len(validation.IsValidLabelValue(hostname)) == 0 {
		node.Labels[corev1.LabelHostname] = hostname
	}
	if err := a.c.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("register Node %s for LCMMachine %s/%s: %w", hostname, m.Namespace, m.Name, err)
	} else if err != nil {
		return nil
	}
	patch := map[string]any{"status": map[string]any{
		"conditions": []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "simulated by the LCM agent", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		"addresses": []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: ip},
			{Type: corev1.NodeHostName, Address: hostname},
		},
	}}
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if err := a.c.Status().Patch(ctx, node, client.RawPatch(types.MergePatchType, data)); err != nil {
		return fmt.Errorf("report Node %s Ready: %w", hostname, err)
	}
	return nil
}

// lcmHostname names a machine's node: the machine's name in a domain named
// after its namespace, so that machines of the same name in two namespaces
// get two Nodes.
func lcmHostname(m *lcmv1.LCMMachine) string {
	return m.Name + "." + m.Namespace
}

// lcmAddress is a stable address in 10.0.0.0/8 for a machine.
func lcmAddress(m *lcmv1.LCMMachine) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(m.Namespace + "/" + m.Name))
	v := h.Sum32()
	return fmt.Sprintf("10.%d.%d.%d", byte(v>>16), byte(v>>8), 1+byte(v)%254)
}

// lcmKeepResults drops the results of items no longer in the spec.
func lcmKeepResults(m *lcmv1.LCMMachine) []lcmv1.StateItemResult {
	kept := make([]lcmv1.StateItemResult, 0, len(m.Status.StateItemResults))
	for _, r := range m.Status.StateItemResults {
		if slices.ContainsFunc(m.Spec.StateItems, func(i lcmv1.StateItem) bool { return i.Name == r.Name }) {
			kept = append(kept, r)
		}
	}
	return kept
}

func lcmSetResult(results []lcmv1.StateItemResult, res lcmv1.StateItemResult) []lcmv1.StateItemResult {
	for i := range results {
		if results[i].Name == res.Name {
			results[i] = res
			return results
		}
	}
	return append(results, res)
}

// lcmSettledState is the state of a machine with every item done: Ready
// once it has deploy items, else Pending (prepared, waiting to deploy).
func lcmSettledState(items []lcmv1.StateItem) lcmv1.MachineState {
	if slices.ContainsFunc(items, func(i lcmv1.StateItem) bool { return i.Phase == lcmv1.StatePhaseDeploy }) {
		return lcmv1.MachineStateReady
	}
	return lcmv1.MachineStatePending
}

// lcmWorkingState is the state a machine reports while it runs pending:
// Prepare when only prepare items are pending; otherwise a machine keeps
// the Deploy or Upgrade it is in until it is done, a machine never
// deployed is in Deploy, and a deployed one is in Upgrade for new deploy
// items and in Reconfigure for new reconfigure items alone.
func lcmWorkingState(m *lcmv1.LCMMachine, pending []lcmv1.StateItem) lcmv1.MachineState {
	has := func(p lcmv1.StatePhase) bool {
		return slices.ContainsFunc(pending, func(i lcmv1.StateItem) bool { return i.Phase == p })
	}
	switch {
	case !has(lcmv1.StatePhaseDeploy) && !has(lcmv1.StatePhaseReconfigure):
		return lcmv1.MachineStatePrepare
	case m.Status.State == lcmv1.MachineStateDeploy || m.Status.State == lcmv1.MachineStateUpgrade:
		return m.Status.State
	case !m.DeployedBefore():
		return lcmv1.MachineStateDeploy
	case has(lcmv1.StatePhaseDeploy):
		return lcmv1.MachineStateUpgrade
	default:
		return lcmv1.MachineStateReconfigure
	}
}

func lcmPtr[T any](v T) *T { return &v }

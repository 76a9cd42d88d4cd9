package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultKubeletNode is the name of the Node a Kubelet registers unless
// KubeletOptions.NodeName says otherwise.
const DefaultKubeletNode = "capstan-sim-node"

// KubeletNodeLabel marks the Node a Kubelet registers.
const KubeletNodeLabel = "sim.capstan.dev/kubelet"

// kubeletLeaseRenew is how often the Node's Lease is renewed: well within
// kube-controller-manager's node-monitor-grace-period (40 s), so that the
// node lifecycle controller never marks the node unreachable and evicts
// its pods.
const kubeletLeaseRenew = 10 * time.Second

// KubeletOptions tune the Kubelet simulator.
type KubeletOptions struct {
	// Namespaces limits it to the Pods of these namespaces. Empty means
	// every namespace.
	Namespaces []string

	// NodeName names the simulated Node. Empty means DefaultKubeletNode.
	NodeName string

	// StartDelay is how long a Pod takes from bound to Running and Ready.
	// Zero starts it at once.
	StartDelay time.Duration
}

// Kubelet plays kube-scheduler and the kubelet of one Node for clusters
// where nothing runs pods: it registers a Ready Node and keeps its Lease
// renewed, binds every unscheduled Pod of its namespaces to that Node,
// reports each bound Pod Running and Ready (every container started and
// ready), and confirms the deletion of a Pod being deleted, as a kubelet
// does once its containers stopped.
//
// It writes Pods, Bindings, the Node and its Lease; never a Deployment or
// a ReplicaSet. With kube-controller-manager running, the real Deployment
// and ReplicaSet controllers create the Pods and count them, so a
// Deployment's status (replicas, readyReplicas, availableReplicas, the
// Available and Progressing conditions) is theirs, computed from these
// Pods. Without kube-controller-manager no Pod is ever created and the
// Kubelet has nothing to do.
type Kubelet struct {
	c    client.WithWatch
	opts KubeletOptions

	mu      sync.Mutex
	started map[types.UID]bool // pods whose start is scheduled
	wg      sync.WaitGroup
}

// NewKubelet returns a Kubelet that talks to the cluster through c, whose
// scheme needs the core and coordination types (client-go's scheme).
func NewKubelet(c client.WithWatch, opts KubeletOptions) *Kubelet {
	if opts.NodeName == "" {
		opts.NodeName = DefaultKubeletNode
	}
	return &Kubelet{c: c, opts: opts, started: map[types.UID]bool{}}
}

// NodeName is the name of the Node the Kubelet registers.
func (k *Kubelet) NodeName() string { return k.opts.NodeName }

// Run registers the Node and plays the kubelet until ctx ends, then
// returns nil once every pending Pod start has stopped. It fails only
// when the Node cannot be registered; other errors are retried.
func (k *Kubelet) Run(ctx context.Context) error {
	if err := k.register(ctx); err != nil {
		return fmt.Errorf("kubelet: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		k.wg.Wait()
	}()
	k.wg.Go(func() { k.renewLease(ctx) })
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := k.listAndWatch(ctx)
		if ctx.Err() != nil {
			return nil
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

// register creates the Node, or takes the one a previous run created, and
// reports it Ready.
func (k *Kubelet) register(ctx context.Context) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   k.opts.NodeName,
		Labels: map[string]string{KubeletNodeLabel: "true", corev1.LabelHostname: k.opts.NodeName},
	}}
	if err := k.c.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("register Node %s: %w", k.opts.NodeName, err)
	}
	now := metav1.Now()
	patch, err := json.Marshal(map[string]any{"status": map[string]any{
		"conditions": []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "simulated by the capstan kubelet simulator", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		"addresses": []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: k.opts.NodeName}},
	}})
	if err != nil {
		return err
	}
	if err := k.c.Status().Patch(ctx, node, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("report Node %s Ready: %w", k.opts.NodeName, err)
	}
	return k.renew(ctx)
}

// renewLease renews the Node's Lease until ctx ends: the heartbeat the
// node lifecycle controller reads.
func (k *Kubelet) renewLease(ctx context.Context) {
	t := time.NewTicker(kubeletLeaseRenew)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = k.renew(ctx) // the next tick tries again
		}
	}
}

func (k *Kubelet) renew(ctx context.Context) error {
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{}
	key := client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: k.opts.NodeName}
	err := k.c.Get(ctx, key, lease)
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr.To(k.opts.NodeName), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now,
			},
		}
		err = k.c.Create(ctx, lease)
		if err == nil || !apierrors.IsAlreadyExists(err) {
			return err
		}
		err = k.c.Get(ctx, key, lease)
	}
	if err != nil {
		return fmt.Errorf("renew the Lease of Node %s: %w", k.opts.NodeName, err)
	}
	lease.Spec.RenewTime = &now
	return k.c.Update(ctx, lease)
}

// listAndWatch lists the Pods, handles each, then follows the watch until
// it ends.
func (k *Kubelet) listAndWatch(ctx context.Context) error {
	var opts []client.ListOption
	if len(k.opts.Namespaces) == 1 {
		opts = append(opts, client.InNamespace(k.opts.Namespaces[0]))
	}
	list := &corev1.PodList{}
	if err := k.c.List(ctx, list, opts...); err != nil {
		return fmt.Errorf("list Pods: %w", err)
	}
	for i := range list.Items {
		k.handle(ctx, &list.Items[i])
	}
	w, err := k.c.Watch(ctx, &corev1.PodList{}, append(opts, &client.ListOptions{Raw: &metav1.ListOptions{
		ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true,
	}})...)
	if err != nil {
		return fmt.Errorf("watch Pods: %w", err)
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
			pod, isPod := ev.Object.(*corev1.Pod)
			switch {
			case ev.Type == watch.Error:
				return nil // relist, e.g. after "resource version too old"
			case !isPod || ev.Type == watch.Bookmark:
			case ev.Type == watch.Deleted:
				k.mu.Lock()
				delete(k.started, pod.UID)
				k.mu.Unlock()
			default:
				k.handle(ctx, pod)
			}
		}
	}
}

// mine reports whether the Pod is this Kubelet's to schedule or run.
func (k *Kubelet) mine(pod *corev1.Pod) bool {
	if len(k.opts.Namespaces) > 0 && !slices.Contains(k.opts.Namespaces, pod.Namespace) {
		return false
	}
	if pod.Spec.NodeName != "" {
		return pod.Spec.NodeName == k.opts.NodeName
	}
	return pod.Spec.SchedulerName == "" || pod.Spec.SchedulerName == corev1.DefaultSchedulerName
}

// handle takes the next step for one Pod: confirm its deletion, bind it,
// or start it. A failed step is left to the next event or relist: the
// watch sees the Pod again whenever it changes.
func (k *Kubelet) handle(ctx context.Context, pod *corev1.Pod) {
	if !k.mine(pod) {
		return
	}
	var err error
	switch {
	case pod.DeletionTimestamp != nil:
		// The containers are stopped: the deletion completes.
		err = k.c.Delete(ctx, pod, client.GracePeriodSeconds(0))
		if apierrors.IsNotFound(err) {
			err = nil
		}
	case pod.Spec.NodeName == "":
		err = k.bind(ctx, pod)
	case !podReady(pod):
		k.start(ctx, pod)
	}
	if err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		// A transient failure: retry this pod shortly.
		k.wg.Go(func() {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
				fresh := &corev1.Pod{}
				if k.c.Get(ctx, client.ObjectKeyFromObject(pod), fresh) == nil {
					k.handle(ctx, fresh)
				}
			}
		})
	}
}

// bind assigns the Pod to the Node, as kube-scheduler does.
func (k *Kubelet) bind(ctx context.Context, pod *corev1.Pod) error {
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: k.opts.NodeName},
	}
	if err := k.c.SubResource("binding").Create(ctx, pod, binding); err != nil {
		return fmt.Errorf("bind Pod %s/%s to Node %s: %w", pod.Namespace, pod.Name, k.opts.NodeName, err)
	}
	return nil
}

// start reports the Pod Running and Ready after StartDelay, once.
func (k *Kubelet) start(ctx context.Context, pod *corev1.Pod) {
	k.mu.Lock()
	if k.started[pod.UID] {
		k.mu.Unlock()
		return
	}
	k.started[pod.UID] = true
	k.mu.Unlock()
	k.wg.Go(func() {
		if k.opts.StartDelay > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(k.opts.StartDelay):
			}
		}
		if err := k.reportRunning(ctx, client.ObjectKeyFromObject(pod)); err != nil && ctx.Err() == nil {
			// Let the next event about the pod try again.
			k.mu.Lock()
			delete(k.started, pod.UID)
			k.mu.Unlock()
		}
	})
}

// reportRunning writes the status a kubelet writes for a Pod whose
// containers all started and passed their readiness probes.
func (k *Kubelet) reportRunning(ctx context.Context, key client.ObjectKey) error {
	pod := &corev1.Pod{}
	if err := k.c.Get(ctx, key, pod); err != nil {
		return err
	}
	if pod.DeletionTimestamp != nil || podReady(pod) {
		return nil
	}
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.StartTime = &now
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	if err := k.c.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("report Pod %s/%s running: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

func podReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

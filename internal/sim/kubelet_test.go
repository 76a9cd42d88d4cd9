package sim

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// TestKubeletMine pins which Pods a Kubelet schedules and runs.
func TestKubeletMine(t *testing.T) {
	k := NewKubelet(nil, KubeletOptions{Namespaces: []string{"providers"}, NodeName: "n1"})
	all := NewKubelet(nil, KubeletOptions{})
	pod := func(ns, node, scheduler string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}, Spec: corev1.PodSpec{NodeName: node, SchedulerName: scheduler}}
	}
	cases := []struct {
		name string
		k    *Kubelet
		pod  *corev1.Pod
		want bool
	}{
		{"an unscheduled pod of its namespace", k, pod("providers", "", ""), true},
		{"an unscheduled pod for the default scheduler", k, pod("providers", "", corev1.DefaultSchedulerName), true},
		{"a pod bound to its node", k, pod("providers", "n1", ""), true},
		{"a pod of another namespace", k, pod("apps", "", ""), false},
		{"a pod bound to another node", k, pod("providers", "n2", ""), false},
		{"a pod for another scheduler", k, pod("providers", "", "volcano"), false},
		{"any namespace when none is given", all, pod("apps", "", ""), true},
		{"the default node name", all, pod("apps", DefaultKubeletNode, ""), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.k.mine(tc.pod); got != tc.want {
				t.Errorf("mine = %t, want %t", got, tc.want)
			}
		})
	}
}

// TestKubelet runs the Kubelet against a real API server (no
// kube-controller-manager, so the test creates the Pods a ReplicaSet
// would): it registers a Ready Node with a renewed Lease, binds and starts
// the Pods of its namespace, leaves the others alone, completes a
// graceful deletion at once, and starts again over its own Node.
func TestKubelet(t *testing.T) {
	env := sharedEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := kubeletNamespace(t, env, c, "kubelet")
	other := kubeletNamespace(t, env, c, "kubelet-other")
	node := "sim-node-" + ns

	runKubelet := func() context.CancelFunc {
		k := NewKubelet(c, KubeletOptions{Namespaces: []string{ns}, NodeName: node, StartDelay: 50 * time.Millisecond})
		kctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- k.Run(kctx) }()
		return func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("kubelet: %v", err)
			}
		}
	}
	stop := runKubelet()

	n := &corev1.Node{}
	waitUntil(t, ctx, "the Node registered Ready", func() bool {
		return c.Get(ctx, client.ObjectKey{Name: node}, n) == nil && len(n.Status.Conditions) == 1 &&
			n.Status.Conditions[0].Type == corev1.NodeReady && n.Status.Conditions[0].Status == corev1.ConditionTrue
	})
	if n.Labels[KubeletNodeLabel] != "true" {
		t.Errorf("Node %s: labels %v; want the kubelet label", node, n.Labels)
	}
	// The Lease follows the Node's registration, as a kubelet's does.
	lease := &coordinationv1.Lease{}
	waitUntil(t, ctx, "the Node's Lease renewed", func() bool {
		return c.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: node}, lease) == nil && lease.Spec.RenewTime != nil
	})

	mine := kubeletPod(ns, "controller", "manager", "kube-rbac-proxy")
	theirs := kubeletPod(other, "elsewhere", "app")
	for _, p := range []*corev1.Pod{mine, theirs} {
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	running := &corev1.Pod{}
	waitUntil(t, ctx, "the Pod bound, Running and Ready", func() bool {
		return c.Get(ctx, client.ObjectKeyFromObject(mine), running) == nil && podReady(running)
	})
	if running.Spec.NodeName != node || len(running.Status.ContainerStatuses) != 2 {
		t.Errorf("Pod %s: node %q, %d container statuses; want it on %s with both containers", mine.Name, running.Spec.NodeName, len(running.Status.ContainerStatuses), node)
	}
	for _, cs := range running.Status.ContainerStatuses {
		if !cs.Ready || cs.State.Running == nil {
			t.Errorf("container %s: ready %t, state %+v; want it running and ready", cs.Name, cs.Ready, cs.State)
		}
	}
	untouched := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(theirs), untouched); err != nil || untouched.Spec.NodeName != "" || untouched.Status.Phase == corev1.PodRunning {
		t.Errorf("the Pod of another namespace: %v, node %q, phase %s; want it left unscheduled", err, untouched.Spec.NodeName, untouched.Status.Phase)
	}

	// A graceful delete (30 s by default) completes as soon as the kubelet
	// sees it.
	if err := c.Delete(ctx, running); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, "the deleted Pod gone", func() bool {
		return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(mine), &corev1.Pod{}))
	})

	// Restarted over the Node it registered, it goes on.
	stop()
	stop = runKubelet()
	defer stop()
	again := kubeletPod(ns, "again", "manager")
	if err := c.Create(ctx, again); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, ctx, "a Pod started by the restarted kubelet", func() bool {
		p := &corev1.Pod{}
		return c.Get(ctx, client.ObjectKeyFromObject(again), p) == nil && podReady(p) && p.Spec.NodeName == node
	})
}

// kubeletNamespace creates a namespace with the default ServiceAccount,
// which the ServiceAccount admission plugin wants before it admits a Pod
// and which only kube-controller-manager would create.
func kubeletNamespace(t *testing.T, env *testenv.Env, c client.Client, name string) string {
	t.Helper()
	ns, err := env.CreateNamespace(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}); err != nil {
		t.Fatal(err)
	}
	return ns
}

func kubeletPod(ns, name string, containers ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Image: "registry.invalid/" + c + ":1"})
	}
	return p
}

// waitUntil polls cond until it holds or ctx ends.
func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	if err := pollUntil(ctx, func() (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

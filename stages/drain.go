package stages

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// drainMarkKey is the annotation the rollout puts on a Node it cordons
// for an upgrade. It is how a restarted daemon knows which Nodes it has
// taken out of service (they count against the worker batch) and which
// to put back: the value says whether the Node was schedulable before.
const drainMarkKey = "capstan.dev/drain"

const (
	// drainMarkCordoned: the rollout cordoned the Node and uncordons it
	// once the machine is Ready again.
	drainMarkCordoned = "cordoned"
	// drainMarkFoundCordoned: the Node was unschedulable already (an
	// operator cordoned it); the rollout leaves it so.
	drainMarkFoundCordoned = "found-cordoned"
)

// mirrorPodAnnotation marks the API copy of a static pod, which the
// kubelet owns and an eviction cannot remove.
const mirrorPodAnnotation = "kubernetes.io/config.mirror"

// drainOutcome is where the drain of one Node stands.
type drainOutcome struct {
	// Drained is true when no pod that has to leave is left on the Node.
	Drained bool
	// Evicted counts the evictions this pass made.
	Evicted int
	// Waiting says which pod keeps the Node from being drained, and why:
	// a PodDisruptionBudget, or a pod still terminating.
	Waiting string
}

// mustLeave reports whether a drain evicts the pod. DaemonSet pods stay
// (their controller would put them back at once, and they tolerate the
// cordon), mirror pods stay (the kubelet owns them), and pods already
// finished hold nothing up.
func mustLeave(pod *corev1.Pod) bool {
	if _, mirror := pod.Annotations[mirrorPodAnnotation]; mirror {
		return false
	}
	if owner := metav1.GetControllerOf(pod); owner != nil && owner.Kind == "DaemonSet" {
		return false
	}
	return pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// cordon marks the Node unschedulable and records that the rollout did,
// with whether it was schedulable before.
func (e *Executor) cordon(ctx context.Context, name string) error {
	node := &corev1.Node{}
	if err := e.client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		return fmt.Errorf("cordon Node %s: %w", name, err)
	}
	mark := node.Annotations[drainMarkKey]
	if mark == "" {
		mark = drainMarkCordoned
		if node.Spec.Unschedulable {
			mark = drainMarkFoundCordoned
		}
	}
	if node.Annotations[drainMarkKey] == mark && node.Spec.Unschedulable {
		return nil
	}
	patch := map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{drainMarkKey: mark}},
		"spec":     map[string]any{"unschedulable": true},
	}
	if err := e.patchNode(ctx, node, patch); err != nil {
		return fmt.Errorf("cordon Node %s: %w", name, err)
	}
	return nil
}

// uncordon puts a Node the rollout cordoned back into service, or only
// drops the mark of one an operator had cordoned.
func (e *Executor) uncordon(ctx context.Context, name string) error {
	node := &corev1.Node{}
	if err := e.client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("uncordon Node %s: %w", name, err)
	}
	mark, ok := node.Annotations[drainMarkKey]
	if !ok {
		return nil
	}
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]any{drainMarkKey: nil}}}
	if mark == drainMarkCordoned {
		patch["spec"] = map[string]any{"unschedulable": nil}
	}
	if err := e.patchNode(ctx, node, patch); err != nil {
		return fmt.Errorf("uncordon Node %s: %w", name, err)
	}
	return nil
}

func (e *Executor) patchNode(ctx context.Context, node *corev1.Node, patch map[string]any) error {
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	return e.client.Patch(ctx, node, client.RawPatch(types.MergePatchType, data))
}

// evictPods asks the Eviction API to remove every pod that must leave the
// Node, so that PodDisruptionBudgets are honoured: an eviction a budget
// refuses (429) is not an error, the drain waits and asks again when the
// budget or the pods change. The Node is drained once no such pod is
// left, terminating ones included.
func (e *Executor) evictPods(ctx context.Context, node string) (drainOutcome, error) {
	pods := &corev1.PodList{}
	if err := e.client.List(ctx, pods, client.MatchingFields{"spec.nodeName": node}); err != nil {
		return drainOutcome{}, fmt.Errorf("drain Node %s: list its pods: %w", node, err)
	}
	sort.Slice(pods.Items, func(i, j int) bool { return podRef(&pods.Items[i]) < podRef(&pods.Items[j]) })
	var out drainOutcome
	var blocked, terminating []string
	left := 0
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !mustLeave(pod) {
			continue
		}
		left++
		if pod.DeletionTimestamp != nil {
			terminating = append(terminating, podRef(pod))
			continue
		}
		eviction := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}}
		err := e.client.SubResource("eviction").Create(ctx, pod, eviction)
		switch {
		case err == nil:
			out.Evicted++
		case apierrors.IsNotFound(err):
			left--
		case apierrors.IsTooManyRequests(err):
			blocked = append(blocked, e.describeBudget(ctx, pod, err))
		default:
			return out, fmt.Errorf("drain Node %s: evict %s: %w", node, podRef(pod), err)
		}
	}
	out.Drained = left == 0
	switch {
	case len(blocked) > 0:
		out.Waiting = fmt.Sprintf("drain of Node %s: %s", node, strings.Join(blocked, "; "))
	case len(terminating) > 0:
		out.Waiting = fmt.Sprintf("drain of Node %s: waiting for %s to terminate", node, sample(terminating))
	case !out.Drained:
		out.Waiting = fmt.Sprintf("drain of Node %s: %d pods evicted, waiting for them to go", node, out.Evicted)
	}
	return out, nil
}

// describeBudget names what refused the eviction of pod: the budgets
// that select it, with what they allow.
func (e *Executor) describeBudget(ctx context.Context, pod *corev1.Pod, evictErr error) string {
	prefix := "eviction of " + podRef(pod) + " refused"
	budgets := &policyv1.PodDisruptionBudgetList{}
	if err := e.client.List(ctx, budgets, client.InNamespace(pod.Namespace)); err != nil {
		return prefix + ": " + evictErr.Error()
	}
	var names []string
	for i := range budgets.Items {
		pdb := &budgets.Items[i]
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		names = append(names, describePDB(pdb))
	}
	if len(names) == 0 {
		return prefix + ": " + evictErr.Error()
	}
	return prefix + " by " + strings.Join(names, ", ")
}

// describePDB says what a budget allows, from the status the disruption
// controller keeps.
func describePDB(pdb *policyv1.PodDisruptionBudget) string {
	return fmt.Sprintf("PodDisruptionBudget %s/%s (%d disruptions allowed: %d healthy, %d needed)",
		pdb.Namespace, pdb.Name, pdb.Status.DisruptionsAllowed, pdb.Status.CurrentHealthy, pdb.Status.DesiredHealthy)
}

func podRef(pod *corev1.Pod) string {
	return "Pod/" + pod.Namespace + "/" + pod.Name
}

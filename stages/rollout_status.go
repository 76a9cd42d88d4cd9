package stages

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
)

// clusterStatus is the status the rollout reports on an LCMCluster: how
// many of its machines of each type run every StateItem of spec.release
// and are Ready, and whether all do. It depends on the cluster and its
// machines only, not on the stage, so every rollout stage reports the same.
func clusterStatus(c rolloutCluster) lcmv1.LCMClusterStatus {
	st := *c.Cluster.Status.DeepCopy()
	st.ObservedGeneration = c.Cluster.Generation
	st.Managers, st.Workers = lcmv1.MachineCounts{}, lcmv1.MachineCounts{}
	for _, m := range c.Machines {
		counts := &st.Workers
		if m.Spec.Type == lcmv1.MachineTypeManager {
			counts = &st.Managers
		}
		counts.Total++
		if progressOf(m.LCMMachine, desiredItems(c.Cluster, m.Spec.Type), lcmv1.StatePhaseDeploy) == progressDone {
			counts.Ready++
		}
	}
	total, ready := st.Managers.Total+st.Workers.Total, st.Managers.Ready+st.Workers.Ready
	release := c.Cluster.Spec.Release
	if ready == total {
		st.Release = release
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue,
			Reason: "Deployed", ObservedGeneration: st.ObservedGeneration,
			Message: fmt.Sprintf("all %d machines Ready at release %s", total, release)})
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: "Reconciling", Status: metav1.ConditionFalse,
			Reason: "Deployed", ObservedGeneration: st.ObservedGeneration})
	} else {
		msg := fmt.Sprintf("%d/%d machines Ready at release %s", ready, total, release)
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse,
			Reason: "RollingOut", ObservedGeneration: st.ObservedGeneration, Message: msg})
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: "Reconciling", Status: metav1.ConditionTrue,
			Reason: "RollingOut", ObservedGeneration: st.ObservedGeneration, Message: msg})
	}
	return st
}

// reportCluster writes clusterStatus to the LCMCluster when it differs
// from what the cluster holds.
func (e *Executor) reportCluster(ctx context.Context, c rolloutCluster) error {
	if c.Cluster == nil {
		return nil
	}
	st := clusterStatus(c)
	if reflect.DeepEqual(st, c.Cluster.Status) {
		return nil
	}
	// Every field is written: a merge patch leaves out what is omitted, and
	// a count back to zero is omitted from the marshalled status.
	counts := func(c lcmv1.MachineCounts) map[string]any { return map[string]any{"total": c.Total, "ready": c.Ready} }
	data, err := json.Marshal(map[string]any{"status": map[string]any{
		"observedGeneration": st.ObservedGeneration,
		"release":            st.Release,
		"managers":           counts(st.Managers),
		"workers":            counts(st.Workers),
		"conditions":         st.Conditions,
	}})
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(lcmClusterGVK)
	u.SetNamespace(c.Namespace)
	u.SetName(c.Name)
	if err := e.client.Status().Patch(ctx, u, client.RawPatch(types.MergePatchType, data)); err != nil {
		return fmt.Errorf("report status of %s: %w", c.ref(), err)
	}
	return nil
}

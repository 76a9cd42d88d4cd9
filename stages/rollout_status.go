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
	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
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

// objectsReady is the progress of a stage that waits for its objects; nil
// for a stage without any.
func objectsReady(ready, total int) *capstanv1.StageProgress {
	if total == 0 {
		return nil
	}
	return &capstanv1.StageProgress{Done: int32(ready), Total: int32(total), Unit: "objects ready"}
}

// rolloutProgress counts the machines of a rollout stage that are done
// with its phase ("3/5 machines ready", "100/120 workers ready"), by the
// same judgement planRollout makes. A stage with a limit counts its
// workers up to the limit. Machines of an LCMCluster that does not exist
// yet count as not done.
func rolloutProgress(clusters []rolloutCluster, s rolloutSettings) *capstanv1.StageProgress {
	var done, total int
	for _, c := range clusters {
		var workersDone, workers int
		for _, m := range c.Machines {
			if !s.covers(m.Spec.Type) {
				continue
			}
			isDone := c.Cluster != nil && progressOf(m.LCMMachine, targetItems(c.Cluster, m.LCMMachine, s.phase), s.phase) == progressDone
			if m.Spec.Type == lcmv1.MachineTypeWorker && s.phase == lcmv1.StatePhaseDeploy {
				workers++
				if isDone {
					workersDone++
				}
				continue
			}
			total++
			if isDone {
				done++
			}
		}
		if s.limit > 0 {
			workers = min(workers, s.limit)
			workersDone = min(workersDone, workers)
		}
		done, total = done+workersDone, total+workers
	}
	if total == 0 {
		return nil
	}
	return &capstanv1.StageProgress{Done: int32(done), Total: int32(total), Unit: rolloutUnit(s)}
}

// rolloutUnit names what a rollout stage counts: its machines by type,
// and what done means in its phase.
func rolloutUnit(s rolloutSettings) string {
	noun := "machines"
	switch s.machineType {
	case lcmv1.MachineTypeManager:
		noun = "managers"
	case lcmv1.MachineTypeWorker:
		noun = "workers"
	}
	if s.phase == lcmv1.StatePhasePrepare {
		return noun + " prepared"
	}
	return noun + " ready"
}

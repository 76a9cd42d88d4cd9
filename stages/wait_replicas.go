package stages

import (
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// replicaCount is how far an object that rolls out replicas is: a
// KubeadmControlPlane or MachineDeployment replacing machines on an
// upgrade, a Deployment replacing pods.
type replicaCount struct {
	updated, desired int64
	machines         bool // a Cluster API kind: its replicas are machines
}

// replicasOf reads spec.replicas and status.updatedReplicas; ok is false
// for an object without both, which has nothing to roll out.
func replicasOf(obj *unstructured.Unstructured) (replicaCount, bool) {
	desired, found, err := unstructured.NestedInt64(obj.Object, "spec", "replicas")
	if err != nil || !found {
		return replicaCount{}, false
	}
	updated, found, err := unstructured.NestedInt64(obj.Object, "status", "updatedReplicas")
	if err != nil || !found {
		return replicaCount{}, false
	}
	group := obj.GroupVersionKind().Group
	return replicaCount{
		updated:  min(max(updated, 0), max(desired, 0)),
		desired:  max(desired, 0),
		machines: strings.HasSuffix(group, "cluster.x-k8s.io"),
	}, true
}

// replicaProgress is the progress of a stage whose unready objects roll
// out replicas: how many of their replicas are up to date ("3/5 machines
// up to date" while a control plane is upgraded), which says more than
// "0/1 objects ready". nil when no unready object counts replicas.
func replicaProgress(pending map[objectKey]string, counts map[objectKey]replicaCount) *capstanv1.StageProgress {
	var updated, desired int64
	machines, counted := true, false
	for k := range pending {
		c, ok := counts[k]
		if !ok {
			continue
		}
		counted = true
		updated, desired = updated+c.updated, desired+c.desired
		machines = machines && c.machines
	}
	if !counted || desired == 0 {
		return nil
	}
	unit := "replicas up to date"
	if machines {
		unit = "machines up to date"
	}
	return &capstanv1.StageProgress{Done: int32(updated), Total: int32(desired), Unit: unit}
}

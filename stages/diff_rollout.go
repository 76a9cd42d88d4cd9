package stages

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// RolloutDiff is a rollout of machines that a change starts: a new
// version or replica count of a MachineDeployment or KubeadmControlPlane
// (carried out by Cluster API), or new StateItems of an LCMCluster
// (carried out by the plan's rollout stages, in the batches listed).
type RolloutDiff struct {
	// Object is the object whose change starts the rollout (Kind/ns/name).
	Object string `json:"object"`
	// Changes are the changes that start it, e.g. "replicas: 2 -> 3".
	Changes []string `json:"changes"`
	// Strategy says how the machines are replaced, in a sentence.
	Strategy string `json:"strategy,omitempty"`
	// Batches are the LCM machines in the order the rollout stages hand
	// them their new items.
	Batches []RolloutBatch `json:"batches,omitempty"`
}

// RolloutBatch is a group of LCM machines that a rollout stage works on at
// the same time (at most: the stage keeps a sliding window of that size).
type RolloutBatch struct {
	// Stage is the rollout stage.
	Stage string `json:"stage"`
	// Phase is prepare or deploy.
	Phase string `json:"phase"`
	// Type is manager or worker; empty for prepare, which takes both.
	Type string `json:"type,omitempty"`
	// Machines are the LCMMachines' names, sorted.
	Machines []string `json:"machines"`
	// Drain is true when deployed workers are cordoned and drained
	// before their upgrade.
	Drain bool `json:"drain,omitempty"`
}

var (
	machineDeploymentGK = schema.GroupKind{Group: "cluster.x-k8s.io", Kind: "MachineDeployment"}
	controlPlaneGK      = schema.GroupKind{Group: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane"}
)

// diffRollouts adds to each apply stage the rollouts its changes start.
// dryRuns and lives hold, by object ID, the objects as the apply would
// leave them and as they are.
func (e *Executor) diffRollouts(ctx context.Context, d *PlanDiff, plan *Plan, dryRuns, lives map[string]*unstructured.Unstructured) error {
	machines := lcmMachines{e: e, lives: map[string][]lcmv1.LCMMachine{}}
	for i := range plan.Stages {
		stage := &plan.Stages[i]
		if stage.Action != capstanv1.StageActionApply && stage.Action != "" {
			continue
		}
		for j, obj := range stage.Objects {
			od := d.Stages[i].Objects[j]
			id := ObjectID(obj)
			applied, live := dryRuns[id], lives[id]
			if applied == nil || od.Problem() {
				continue
			}
			var r *RolloutDiff
			var err error
			switch gk := obj.GroupVersionKind().GroupKind(); gk {
			case machineDeploymentGK, controlPlaneGK:
				if od.Action == DiffChange {
					r = capiRollout(gk, applied, live)
				}
			case lcmClusterGVK.GroupKind():
				r, err = machines.rollout(ctx, plan, dryRuns, applied, live)
			}
			if err != nil {
				return err
			}
			if r != nil {
				r.Object = od.Ref
				d.Stages[i].Rollouts = append(d.Stages[i].Rollouts, *r)
			}
		}
	}
	return nil
}

// capiRollout describes what Cluster API does after a change of version or
// replicas, or nil when neither changes.
func capiRollout(gk schema.GroupKind, applied, live *unstructured.Unstructured) *RolloutDiff {
	versionPath := []string{"spec", "template", "spec", "version"}
	if gk == controlPlaneGK {
		versionPath = []string{"spec", "version"}
	}
	oldVersion, _, _ := unstructured.NestedString(live.Object, versionPath...)
	newVersion, _, _ := unstructured.NestedString(applied.Object, versionPath...)
	oldReplicas, _, _ := unstructured.NestedInt64(live.Object, "spec", "replicas")
	newReplicas, hasReplicas, _ := unstructured.NestedInt64(applied.Object, "spec", "replicas")
	if !hasReplicas {
		newReplicas = 1
	}
	r := &RolloutDiff{}
	if oldVersion != newVersion {
		r.Changes = append(r.Changes, fmt.Sprintf("version: %s -> %s", orNone(oldVersion), orNone(newVersion)))
	}
	if oldReplicas != newReplicas {
		r.Changes = append(r.Changes, fmt.Sprintf("replicas: %d -> %d", oldReplicas, newReplicas))
	}
	if len(r.Changes) == 0 {
		return nil
	}
	var parts []string
	if oldVersion != newVersion {
		strategy, surge, unavailable := capiStrategy(gk, applied, int(newReplicas))
		switch {
		case strategy == "OnDelete":
			parts = append(parts, fmt.Sprintf("OnDelete: each of the %d machines is replaced by the new version only when someone deletes it", newReplicas))
		case gk == controlPlaneGK:
			parts = append(parts, fmt.Sprintf("rolling update of %d control-plane machines, %d new one at a time (maxSurge %d), each old one removed from etcd and deleted after its replacement is up",
				newReplicas, max(surge, 1), surge))
		default:
			parts = append(parts, fmt.Sprintf("rolling update of %d machines: at most %d new machines above %d and %d unavailable at a time (maxSurge %d, maxUnavailable %d); each old machine is drained, then deleted",
				newReplicas, surge, newReplicas, unavailable, surge, unavailable))
		}
	}
	switch {
	case newReplicas > oldReplicas:
		parts = append(parts, fmt.Sprintf("%d new machines", newReplicas-oldReplicas))
	case newReplicas < oldReplicas:
		parts = append(parts, fmt.Sprintf("%d machines drained and deleted", oldReplicas-newReplicas))
	}
	r.Strategy = strings.Join(parts, "; ")
	return r
}

// capiStrategy reads the rollout strategy of a MachineDeployment or
// KubeadmControlPlane (v1beta2 spec.rollout.strategy, v1beta1
// spec.strategy or spec.rolloutStrategy), with Cluster API's defaults:
// RollingUpdate, maxSurge 1, maxUnavailable 0.
func capiStrategy(gk schema.GroupKind, obj *unstructured.Unstructured, replicas int) (kind string, surge, unavailable int) {
	kind, surge, unavailable = "RollingUpdate", 1, 0
	for _, base := range [][]string{{"spec", "rollout", "strategy"}, {"spec", "strategy"}, {"spec", "rolloutStrategy"}} {
		s, found, _ := unstructured.NestedMap(obj.Object, base...)
		if !found {
			continue
		}
		if t, ok := s["type"].(string); ok && t != "" {
			kind = t
		}
		ru, _ := s["rollingUpdate"].(map[string]any)
		if v, ok := intOrPercent(ru["maxSurge"]); ok {
			if n, err := intstr.GetScaledValueFromIntOrPercent(&v, replicas, true); err == nil {
				surge = n
			}
		}
		if v, ok := intOrPercent(ru["maxUnavailable"]); ok && gk == machineDeploymentGK {
			if n, err := intstr.GetScaledValueFromIntOrPercent(&v, replicas, false); err == nil {
				unavailable = n
			}
		}
		break
	}
	return kind, surge, unavailable
}

func intOrPercent(v any) (intstr.IntOrString, bool) {
	switch v := v.(type) {
	case int64:
		return intstr.FromInt(int(v)), true
	case float64:
		return intstr.FromInt(int(v)), true
	case string:
		return intstr.FromString(v), true
	}
	return intstr.IntOrString{}, false
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// lcmMachines reads the LCMMachines of a namespace once per diff.
type lcmMachines struct {
	e     *Executor
	lives map[string][]lcmv1.LCMMachine
}

func (m *lcmMachines) in(ctx context.Context, ns string) ([]lcmv1.LCMMachine, error) {
	if got, ok := m.lives[ns]; ok {
		return got, nil
	}
	got, err := listLCM[lcmv1.LCMMachine](ctx, m.e.client, lcmMachineGVK, ns)
	if err != nil {
		return nil, fmt.Errorf("list the LCMMachines of %s for the rollout: %w", ns, err)
	}
	m.lives[ns] = got
	return got, nil
}

// rollout works out the batches in which the plan's rollout stages would
// hand the machines of an LCMCluster their new StateItems: the order of
// rolloutStage, played on the machines as they are, without waiting for
// anyone. It is nil when no machine would get new items.
func (m *lcmMachines) rollout(ctx context.Context, plan *Plan, dryRuns map[string]*unstructured.Unstructured, appliedObj, liveObj *unstructured.Unstructured) (*RolloutDiff, error) {
	var cluster lcmv1.LCMCluster
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(appliedObj.Object, &cluster); err != nil {
		return nil, fmt.Errorf("decode %s: %w", ObjectRef(appliedObj), err)
	}
	r := &RolloutDiff{}
	if liveObj != nil {
		var old lcmv1.LCMCluster
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(liveObj.Object, &old); err != nil {
			return nil, fmt.Errorf("decode %s: %w", ObjectRef(liveObj), err)
		}
		if old.Spec.Release != cluster.Spec.Release {
			r.Changes = append(r.Changes, fmt.Sprintf("release: %s -> %s", orNone(old.Spec.Release), orNone(cluster.Spec.Release)))
		}
		if old.Spec.KubernetesVersion != cluster.Spec.KubernetesVersion {
			r.Changes = append(r.Changes, fmt.Sprintf("kubernetesVersion: %s -> %s", orNone(old.Spec.KubernetesVersion), orNone(cluster.Spec.KubernetesVersion)))
		}
		for _, t := range []lcmv1.MachineType{lcmv1.MachineTypeManager, lcmv1.MachineTypeWorker} {
			if !sameItems(desiredItems(&old, t), desiredItems(&cluster, t)) {
				r.Changes = append(r.Changes, fmt.Sprintf("machineTypes.%s: new StateItems", t))
			}
		}
	} else {
		r.Changes = append(r.Changes, "new LCMCluster, release "+orNone(cluster.Spec.Release))
	}
	machines, err := m.of(ctx, plan, dryRuns, &cluster)
	if err != nil {
		return nil, err
	}
	var workerBatch int
	for i := range plan.Stages {
		stage := &plan.Stages[i]
		if stage.Action != capstanv1.StageActionRollout || !rolloutCovers(stage, &cluster, machines) {
			continue
		}
		s, err := rolloutSettingsOf(stage)
		if err != nil {
			continue // the stage fails on its own; BuildPlan's callers see it
		}
		batches := playRolloutStage(stage.Name, s, &cluster, machines)
		r.Batches = append(r.Batches, batches...)
		if s.phase == lcmv1.StatePhaseDeploy && s.covers(lcmv1.MachineTypeWorker) && s.limit == 0 {
			workerBatch = s.batch
		}
	}
	if len(r.Batches) == 0 {
		return nil, nil
	}
	r.Strategy = "prepare on every machine at once, then managers one at a time"
	if workerBatch > 0 {
		r.Strategy += fmt.Sprintf(", then workers at most %d at once (spec.rollout.workerBatchSize)", workerBatch)
	}
	r.Strategy += "; a deployed worker is cordoned and drained (PodDisruptionBudgets honoured) before its upgrade"
	return r, nil
}

// of returns the LCMMachines of cluster, sorted by name, as they will be
// once the plan is applied: the plan's machines as the dry run left them
// (the rollout's items kept), the others as they are.
func (m *lcmMachines) of(ctx context.Context, plan *Plan, dryRuns map[string]*unstructured.Unstructured, cluster *lcmv1.LCMCluster) ([]*lcmv1.LCMMachine, error) {
	live, err := m.in(ctx, cluster.Namespace)
	if err != nil {
		return nil, err
	}
	byName := map[string]*lcmv1.LCMMachine{}
	for i := range live {
		byName[live[i].Name] = &live[i]
	}
	for _, obj := range plan.AppliedObjects() {
		if obj.GroupVersionKind().GroupKind() != lcmMachineGVK.GroupKind() || obj.GetNamespace() != cluster.Namespace {
			continue
		}
		src := obj
		if applied := dryRuns[ObjectID(obj)]; applied != nil {
			src = applied
		}
		var planned lcmv1.LCMMachine
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(src.Object, &planned); err != nil {
			return nil, fmt.Errorf("decode %s: %w", ObjectRef(obj), err)
		}
		if old := byName[planned.Name]; old != nil {
			planned.Status = old.Status
		}
		byName[planned.Name] = &planned
	}
	var out []*lcmv1.LCMMachine
	for _, machine := range byName {
		if machine.Spec.ClusterName == cluster.Name {
			copied := machine.DeepCopy()
			out = append(out, copied)
		}
	}
	slices.SortFunc(out, func(a, b *lcmv1.LCMMachine) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// rolloutCovers reports whether a rollout stage acts on the cluster: its
// objects hold the LCMCluster or one of its machines.
func rolloutCovers(stage *Stage, cluster *lcmv1.LCMCluster, machines []*lcmv1.LCMMachine) bool {
	scope := rolloutScopeOf(stage)[cluster.Namespace]
	if scope == nil {
		return false
	}
	if scope.clusters[cluster.Name] {
		return true
	}
	return slices.ContainsFunc(machines, func(m *lcmv1.LCMMachine) bool { return scope.machines[m.Name] })
}

// playRolloutStage hands the machines the items one rollout stage would,
// in its order, and returns its batches. machines are updated in place,
// so that a later stage starts where this one ends.
func playRolloutStage(stage string, s rolloutSettings, cluster *lcmv1.LCMCluster, machines []*lcmv1.LCMMachine) []RolloutBatch {
	var batches []RolloutBatch
	if s.phase == lcmv1.StatePhasePrepare {
		b := RolloutBatch{Stage: stage, Phase: string(s.phase)}
		for _, m := range machines {
			if !s.covers(m.Spec.Type) {
				continue
			}
			if target := targetItems(cluster, m, lcmv1.StatePhasePrepare); !sameItems(m.Spec.StateItems, target) {
				b.Machines = append(b.Machines, m.Name)
				m.Spec.StateItems = target
			}
		}
		if len(b.Machines) > 0 {
			batches = append(batches, b)
		}
		return batches
	}
	if s.covers(lcmv1.MachineTypeManager) {
		for _, m := range machines {
			target := desiredItems(cluster, m.Spec.Type)
			if m.Spec.Type != lcmv1.MachineTypeManager || sameItems(m.Spec.StateItems, target) {
				continue
			}
			batches = append(batches, RolloutBatch{Stage: stage, Phase: string(s.phase), Type: string(lcmv1.MachineTypeManager), Machines: []string{m.Name}})
			m.Spec.StateItems = target
		}
	}
	if !s.covers(lcmv1.MachineTypeWorker) {
		return batches
	}
	var todo []*lcmv1.LCMMachine
	done := 0
	for _, m := range machines {
		if m.Spec.Type != lcmv1.MachineTypeWorker {
			continue
		}
		if sameItems(m.Spec.StateItems, desiredItems(cluster, m.Spec.Type)) {
			done++
		} else {
			todo = append(todo, m)
		}
	}
	if s.limit > 0 {
		todo = todo[:min(len(todo), max(0, s.limit-done))]
	}
	batch := max(s.batch, 1)
	for start := 0; start < len(todo); start += batch {
		b := RolloutBatch{Stage: stage, Phase: string(s.phase), Type: string(lcmv1.MachineTypeWorker)}
		for _, m := range todo[start:min(start+batch, len(todo))] {
			target := desiredItems(cluster, m.Spec.Type)
			b.Drain = b.Drain || needsDrain(m, target)
			b.Machines = append(b.Machines, m.Name)
			m.Spec.StateItems = target
		}
		batches = append(batches, b)
	}
	return batches
}

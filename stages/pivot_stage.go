package stages

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// WithHomeDiscovery gives the executor discovery of the cluster Capstan
// runs in, which a pivot stage lists the objects to move with.
func WithHomeDiscovery(d discovery.DiscoveryInterface) ExecutorOption {
	return func(e *Executor) { e.homeDiscovery = d }
}

// discoverer is a Cluster that can list the kinds it serves.
type discoverer interface {
	Discovery() discovery.DiscoveryInterface
}

// pivotStage moves the deployment, everything it applied and what the
// controllers made of it from the cluster Capstan runs in into the
// stage's cluster (its kubeConfig), with pivot.Mover (docs/pivot.md).
// Each step done is recorded on the deployment in the home cluster, so
// that a later attempt, after a crash or a failed step, resumes after it.
// In the target, where the moved deployment arrives marked, the stage is
// done at once: the Capstan there goes on with the stages after it.
func (e *Executor) pivotStage(ctx context.Context, stage *Stage, owner Owner) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	// A deployment can only have arrived through a stage that named its
	// target, so a stage without one can never move anything.
	if e.cluster == nil || e.cluster.Name() == LocalClusterName {
		return failed(res, Stalled(fmt.Errorf("stage %s: a pivot stage moves into the cluster its kubeConfig names (for a Cluster API cluster, Secret <cluster>-kubeconfig); it has none", stage.Name)))
	}
	cd := &unstructured.Unstructured{}
	cd.SetGroupVersionKind(capstanv1.GroupVersion.WithKind("ClusterDeployment"))
	if err := e.home.Get(ctx, client.ObjectKey{Namespace: owner.Namespace, Name: owner.Name}, cd); err != nil {
		return failed(res, fmt.Errorf("stage %s: read ClusterDeployment %s/%s: %w", stage.Name, owner.Namespace, owner.Name, err))
	}
	if from := cd.GetAnnotations()[pivot.ArrivedAnnotation]; from != "" {
		res.State = capstanv1.StageReady
		res.Message = "moved here from " + from
		return res
	}
	targetDisco, ok := e.cluster.(discoverer)
	if !ok || e.homeDiscovery == nil {
		return failed(res, Stalled(fmt.Errorf("stage %s: the executor cannot list the kinds of both clusters", stage.Name)))
	}
	last := pivot.Step(cd.GetAnnotations()[pivot.StepAnnotation])
	if last != "" && cd.GetAnnotations()[pivot.TargetAnnotation] != e.cluster.Name() {
		return failed(res, Stalled(fmt.Errorf("stage %s: ClusterDeployment %s/%s is being moved into %s (step %s done), not %s",
			stage.Name, owner.Namespace, owner.Name, cd.GetAnnotations()[pivot.TargetAnnotation], last, e.cluster.Name())))
	}
	if last == pivot.Steps[len(pivot.Steps)-1] {
		res.State = capstanv1.StageReady
		res.Message = "moved into " + e.cluster.Name()
		res.Moved = true
		return res
	}

	// Up to the copy the source holds everything; after it, the target.
	from, disco := e.home, e.homeDiscovery
	if last != "" && slices.Index(pivot.Steps, last) >= slices.Index(pivot.Steps, pivot.StepCopy) {
		from, disco = e.client, targetDisco.Discovery()
	}
	all, roots, err := pivot.Discover(ctx, from, disco, owner.Namespace, owner.Name)
	if err != nil {
		return failed(res, fmt.Errorf("stage %s: %w", stage.Name, err))
	}
	g, err := pivot.BuildGraph(all, roots)
	if err != nil {
		return failed(res, fmt.Errorf("stage %s: %w", stage.Name, err))
	}
	m := &pivot.Mover{
		Source: e.home, Target: e.client, SourceName: LocalClusterName + " (the bootstrap cluster)", TargetName: e.cluster.Name(),
		Done: func(s pivot.Step) error { return e.recordPivotStep(ctx, owner, s) },
	}
	if err := m.Move(ctx, g, last); err != nil {
		return failed(res, fmt.Errorf("stage %s: %w", stage.Name, err))
	}
	res.State = capstanv1.StageReady
	res.Message = fmt.Sprintf("moved %d objects into %s", g.Len(), e.cluster.Name())
	res.Moved = true
	return res
}

// recordPivotStep writes the last step done on the deployment.
func (e *Executor) recordPivotStep(ctx context.Context, owner Owner, s pivot.Step) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		pivot.StepAnnotation: string(s), pivot.TargetAnnotation: e.cluster.Name(),
	}}})
	if err != nil {
		return err
	}
	cd := &unstructured.Unstructured{}
	cd.SetGroupVersionKind(capstanv1.GroupVersion.WithKind("ClusterDeployment"))
	cd.SetNamespace(owner.Namespace)
	cd.SetName(owner.Name)
	if err := e.home.Patch(ctx, cd, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("record step %s on ClusterDeployment %s/%s: %w", s, owner.Namespace, owner.Name, err)
	}
	return nil
}

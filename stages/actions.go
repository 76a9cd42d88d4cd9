package stages

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// ScaleFieldManager owns the replicas a scale stage sets, apart from the
// fields the apply stages own.
const ScaleFieldManager = "capstan-scale"

// scaleStage sets spec.replicas on the Deployments and StatefulSets the
// stage selects (seed 000 disables controllers before the pivot and enables
// them after): scale.replicas on each, or with scale.committed each one's
// count as its rendered object has it. The workloads must exist: an
// earlier stage applies them. Readiness is then waited for like any
// stage: kstatus Current means the controller rolled the workload to the
// new count.
func (e *Executor) scaleStage(ctx context.Context, stage *Stage, owner Owner) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	if err := checkScale(stage.StageSpec); err != nil {
		return failed(res, Stalled(err))
	}
	// Every object is checked before any is scaled: a wrong kind scales
	// nothing.
	var errs []error
	counts := make([]int64, len(stage.Objects))
	for i, obj := range stage.Objects {
		gk := obj.GroupVersionKind().GroupKind()
		if gk.Group != "apps" || (gk.Kind != "Deployment" && gk.Kind != "StatefulSet") {
			errs = append(errs, fmt.Errorf("%s: a scale stage scales apps/Deployment and apps/StatefulSet only; narrow stage %s's select",
				ObjectRef(obj), stage.Name))
			continue
		}
		n, err := scaleTo(stage.Scale, obj)
		if err != nil {
			errs = append(errs, err)
		}
		counts[i] = n
	}
	if len(errs) > 0 {
		return failed(res, Stalled(errors.Join(errs...)))
	}
	for i, obj := range stage.Objects {
		patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, counts[i]))
		target := &unstructured.Unstructured{}
		target.SetGroupVersionKind(obj.GroupVersionKind())
		target.SetNamespace(obj.GetNamespace())
		target.SetName(obj.GetName())
		err := e.client.Patch(ctx, target, patch, client.FieldOwner(ScaleFieldManager))
		switch {
		case apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("%s: not found; a scale stage acts on workloads an earlier stage applied", ObjectRef(obj)))
		case meta.IsNoMatchError(err):
			errs = append(errs, Stalled(fmt.Errorf("%s: %w", ObjectRef(obj), err)))
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: set replicas to %d: %w", ObjectRef(obj), counts[i], err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		if allStalled(errs) {
			err = Stalled(err)
		}
		return failed(res, err)
	}
	workloads := fmt.Sprintf("%d workloads", len(stage.Objects))
	if len(stage.Objects) == 1 {
		workloads = "1 workload"
	}
	if stage.Scale.Committed {
		res.Message = "replicas set to the committed count on " + workloads
	} else {
		res.Message = fmt.Sprintf("replicas set to %d on %s", *stage.Scale.Replicas, workloads)
	}
	return res
}

// scaleTo is the count a scale stage gives obj: scale.replicas, or with
// scale.committed the one its rendered object sets (1, the API server's
// default, when it sets none).
func scaleTo(sc *capstanv1.ScaleSpec, obj *unstructured.Unstructured) (int64, error) {
	if !sc.Committed {
		return int64(*sc.Replicas), nil
	}
	n, found, err := unstructured.NestedInt64(obj.Object, "spec", "replicas")
	switch {
	case err != nil:
		return 0, fmt.Errorf("%s: spec.replicas: %w; scale.committed needs a whole number there", ObjectRef(obj), err)
	case !found:
		return 1, nil
	case n < 0:
		return 0, fmt.Errorf("%s: spec.replicas: %d: want 0 or more", ObjectRef(obj), n)
	}
	return n, nil
}

// deleteStage deletes the objects the stage selects: a delete stage is how a
// repository says that an object must be gone, such as the bootstrap node
// of seed 001 once the cluster runs without it. Deletion propagates to
// dependents in the background; objects already gone are fine.
func (e *Executor) deleteStage(ctx context.Context, stage *Stage, owner Owner) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	var errs []error
	for _, obj := range stage.Objects {
		target := &unstructured.Unstructured{}
		target.SetGroupVersionKind(obj.GroupVersionKind())
		target.SetNamespace(obj.GetNamespace())
		target.SetName(obj.GetName())
		err := e.client.Delete(ctx, target, client.PropagationPolicy("Background"))
		switch {
		case err == nil, apierrors.IsNotFound(err), meta.IsNoMatchError(err):
		default:
			errs = append(errs, fmt.Errorf("%s: delete: %w", ObjectRef(obj), err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return failed(res, err)
	}
	return res
}

// deletePoll is how often waitDeleted looks again. Deletion waits on
// finalizers that take seconds to minutes; a watch would buy nothing.
const deletePoll = time.Second

// waitDeleted waits until every object the stage deletes is gone, or ctx
// ends; then it says which are left and which finalizers hold them.
func (e *Executor) waitDeleted(ctx context.Context, stage *Stage, owner Owner) Result {
	res := Result{Stage: stage.Name}
	for {
		var left []string
		for _, obj := range stage.Objects {
			cur := &unstructured.Unstructured{}
			cur.SetGroupVersionKind(obj.GroupVersionKind())
			err := e.client.Get(ctx, client.ObjectKeyFromObject(obj), cur)
			switch {
			case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
			case err != nil && ctx.Err() == nil:
				left = append(left, fmt.Sprintf("%s: %v", ObjectRef(obj), err))
			case err == nil:
				msg := ObjectRef(obj) + " is being deleted"
				if f := cur.GetFinalizers(); len(f) > 0 {
					msg += " (finalizers: " + strings.Join(f, ", ") + ")"
				}
				left = append(left, msg)
			}
		}
		if len(left) == 0 && ctx.Err() == nil {
			res.State = capstanv1.StageReady
			return res
		}
		select {
		case <-ctx.Done():
			res.State = capstanv1.StageInProgress
			res.Message = "waiting for deletion: " + strings.Join(left, "; ")
			return res
		case <-time.After(deletePoll):
		}
	}
}

func allStalled(errs []error) bool {
	for _, err := range errs {
		if !IsStalled(err) {
			return false
		}
	}
	return true
}

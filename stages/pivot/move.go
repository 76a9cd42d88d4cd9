package pivot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// MirrorAnnotation marks an object a move left in the source as a
// read-only copy of the one in the target, and names the target.
const MirrorAnnotation = "capstan.dev/mirror-of"

// ArrivedAnnotation marks a ClusterDeployment a move created in the
// target, and names the source: the Capstan there finds its pivot stage
// done and goes on with the stages after it.
const ArrivedAnnotation = "capstan.dev/pivoted-from"

// Step is one step of a move, in the order a move takes them. Each is
// safe to run again: a move that stopped anywhere resumes by running its
// steps from the one recorded last, and ends as an uninterrupted one.
type Step string

// The steps of a move.
const (
	// StepPause stops the controllers in the source from acting on what
	// moves: spec.paused on Clusters, the paused annotation on hosts,
	// spec.suspend on the ClusterDeployment, so that the Capstan of the
	// source neither re-applies what the move deletes nor ever writes to
	// the moved cluster again (its mirror stays suspended).
	StepPause Step = "Pause"
	// StepCopy creates every object in the target, owners first, with
	// owner references rewritten to the target's UIDs and status copied.
	StepCopy Step = "Copy"
	// StepUnpause lets the controllers in the target act, and the Capstan
	// there reconcile the deployment.
	StepUnpause Step = "Unpause"
	// StepCleanSource deletes what moved from the source, except the
	// mirrors, which stay paused and annotated.
	StepCleanSource Step = "CleanSource"
)

// Steps are all steps, in order.
var Steps = []Step{StepPause, StepCopy, StepUnpause, StepCleanSource}

// Mover moves a graph from one cluster to another.
type Mover struct {
	// Source is the cluster the objects are in, Target where they go.
	Source, Target client.Client
	// SourceName and TargetName name the clusters in the annotations of
	// the moved deployment and of the mirrors.
	SourceName, TargetName string
	// TargetID identifies the Capstan of the target (ClusterID). When set,
	// Unpause first hands the fencing record of every ClusterDeployment
	// moved to it, in the target and in the source, so that from then on
	// only the target's Capstan writes for them, whatever restarts.
	TargetID string
	// Mirror says which objects stay in the source as read-only copies;
	// nil means IsMirror.
	Mirror func(Object) bool
	// Done, if set, is called after each step: to record it, or, in
	// tests, to stop there as a crash would.
	Done func(Step) error
	// Touched, if set, is called after each object a step created,
	// paused or deleted; an error stops the move there, as a crash would.
	Touched func(Step, Object) error
}

// touched reports one object done.
func (m *Mover) touched(step Step, u *unstructured.Unstructured) error {
	if m.Touched == nil {
		return nil
	}
	return m.Touched(step, ObjectOf(u))
}

// IsMirror keeps the Cluster API Clusters and Machines in the source, so
// that the bootstrap cluster still shows the cluster it built (seed 000
// step 10), and the ClusterDeployment, which records the move.
func IsMirror(o Object) bool {
	switch o.Kind {
	case "Cluster", "Machine":
		return isClusterAPI(o.APIVersion)
	case "ClusterDeployment":
		return true
	}
	return false
}

// Move runs the steps of a move from the one after last ("" to start),
// calling Done after each. It stops at the first error, which names the
// step and the object; running it again from the same last step resumes.
// A resumed move builds its graph from the source up to and including
// StepCopy, and from the target afterwards: once copied, the target holds
// every object, while the source may already have lost some. Objects are
// found by kind, namespace and name, never by UID, so either graph serves.
func (m *Mover) Move(ctx context.Context, g *Graph, last Step) error {
	start := 0
	if last != "" {
		i := slices.Index(Steps, last)
		if i < 0 {
			return fmt.Errorf("move: unknown step %q", last)
		}
		start = i + 1
	}
	for _, step := range Steps[start:] {
		var err error
		switch step {
		case StepPause:
			err = m.pause(ctx, g)
		case StepCopy:
			err = m.copy(ctx, g)
		case StepUnpause:
			err = m.unpause(ctx, g)
		case StepCleanSource:
			err = m.cleanSource(ctx, g)
		}
		if err != nil {
			return fmt.Errorf("move, step %s: %w", step, err)
		}
		if m.Done != nil {
			if err := m.Done(step); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *Mover) mirror(o Object) bool {
	if m.Mirror != nil {
		return m.Mirror(o)
	}
	return IsMirror(o)
}

// pause pauses the Clusters and hosts in the source.
func (m *Mover) pause(ctx context.Context, g *Graph) error {
	for _, n := range g.PauseTargets() {
		if err := setPaused(ctx, m.Source, n.Object, true); err != nil {
			return err
		}
		if err := m.touched(StepPause, n.Object); err != nil {
			return err
		}
	}
	return nil
}

// setPaused pauses or unpauses one Cluster or host with a merge patch.
func setPaused(ctx context.Context, c client.Client, u *unstructured.Unstructured, paused bool) error {
	var patch map[string]any
	switch u.GetKind() {
	case "Cluster":
		patch = map[string]any{"spec": map[string]any{"paused": paused}}
	case "ClusterDeployment":
		patch = map[string]any{"spec": map[string]any{"suspend": paused}}
	default: // BareMetalHost
		var value any // null removes the annotation
		if paused {
			value = "capstan.dev/pivot"
		}
		patch = map[string]any{"metadata": map[string]any{"annotations": map[string]any{HostPausedAnnotation: value}}}
	}
	raw, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	target := u.DeepCopy()
	if err := c.Patch(ctx, target, client.RawPatch(types.MergePatchType, raw)); err != nil {
		return fmt.Errorf("pause=%t %s: %w", paused, ObjectOf(u), err)
	}
	return nil
}

// copy creates each object in the target, owners first. An object the
// target already has (a move that stopped half-way) is taken as created:
// its UID is what its dependents' owner references point to.
func (m *Mover) copy(ctx context.Context, g *Graph) error {
	order, err := g.CreateOrder()
	if err != nil {
		return err
	}
	uids := map[types.UID]types.UID{} // source UID -> target UID
	namespaces := map[string]bool{}
	for _, n := range order {
		src, err := m.fresh(ctx, m.Source, n.Object)
		if err != nil {
			return err
		}
		if ns := src.GetNamespace(); ns != "" && !namespaces[ns] {
			if err := ensureNamespace(ctx, m.Target, ns); err != nil {
				return err
			}
			namespaces[ns] = true
		}
		existing := src.DeepCopy()
		err = m.Target.Get(ctx, client.ObjectKeyFromObject(src), existing)
		switch {
		case err == nil:
			uids[src.GetUID()] = existing.GetUID()
			continue
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("read %s in the target: %w", ObjectOf(src), err)
		}
		created := copyOf(src, uids)
		if created.GetKind() == "ClusterDeployment" {
			annotations := created.GetAnnotations()
			if annotations == nil {
				annotations = map[string]string{}
			}
			annotations[ArrivedAnnotation] = m.SourceName
			created.SetAnnotations(annotations)
		}
		status, hasStatus := src.Object["status"]
		if created.GetKind() == "ClusterDeployment" && hasStatus {
			// The record of the move is the source's; the target's
			// Capstan writes its own when it takes the deployment over.
			if m, ok := status.(map[string]any); ok {
				status = maps.Clone(m)
				delete(status.(map[string]any), "pivot")
			}
		}
		if err := m.Target.Create(ctx, created); err != nil {
			return fmt.Errorf("create %s in the target: %w", ObjectOf(src), err)
		}
		uids[src.GetUID()] = created.GetUID()
		if hasStatus {
			if err := copyStatus(ctx, m.Target, created, status); err != nil {
				return fmt.Errorf("copy the status of %s: %w", ObjectOf(src), err)
			}
		}
		if err := m.touched(StepCopy, src); err != nil {
			return err
		}
	}
	return nil
}

// copyStatus writes status onto the object just created in the target. A
// controller there may write its own first (Cluster API marks a paused
// Cluster Paused): the copy is retried on the object read again, and
// wins, since it is what the source's controllers observed.
func copyStatus(ctx context.Context, c client.Client, created *unstructured.Unstructured, status any) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		created.Object["status"] = status
		err := c.Status().Update(ctx, created)
		switch {
		case err == nil, apierrors.IsNotFound(err):
			// Kinds without a status subresource kept it on create.
			return nil
		case apierrors.IsConflict(err):
			if gerr := c.Get(ctx, client.ObjectKeyFromObject(created), created); gerr != nil {
				return gerr
			}
		}
		return err
	})
}

// fresh reads the object again: the graph was built before the pause.
func (m *Mover) fresh(ctx context.Context, c client.Client, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	out := u.DeepCopy()
	if err := c.Get(ctx, client.ObjectKeyFromObject(u), out); err != nil {
		return nil, fmt.Errorf("read %s in the source: %w", ObjectOf(u), err)
	}
	return out, nil
}

// copyOf is the object as the target creates it: without what the source
// server assigned, with owner references to the target's owners. An owner
// that did not move is dropped: the target's garbage collector would
// delete an object whose owner it cannot find. A host carries its status
// in the annotation the BareMetal Operator restores it from.
func copyOf(src *unstructured.Unstructured, uids map[types.UID]types.UID) *unstructured.Unstructured {
	u := src.DeepCopy()
	delete(u.Object, "status")
	for _, f := range []string{"uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds"} {
		unstructured.RemoveNestedField(u.Object, "metadata", f)
	}
	var owners []metav1.OwnerReference
	for _, ref := range src.GetOwnerReferences() {
		if uid, ok := uids[ref.UID]; ok {
			ref.UID = uid
			owners = append(owners, ref)
		}
	}
	u.SetOwnerReferences(owners)
	if src.GetKind() == "BareMetalHost" {
		if status, ok := src.Object["status"]; ok {
			if raw, err := json.Marshal(status); err == nil {
				annotations := u.GetAnnotations()
				if annotations == nil {
					annotations = map[string]string{}
				}
				annotations[HostStatusAnnotation] = string(raw)
				u.SetAnnotations(annotations)
			}
		}
	}
	return u
}

func ensureNamespace(ctx context.Context, c client.Client, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s in the target: %w", name, err)
	}
	return nil
}

// unpause hands the fencing records to the target, then unpauses the
// Clusters, hosts and deployments in the target.
func (m *Mover) unpause(ctx context.Context, g *Graph) error {
	if m.TargetID != "" {
		for _, n := range g.Nodes() {
			if n.Object.GetKind() != "ClusterDeployment" {
				continue
			}
			for _, c := range []client.Client{m.Target, m.Source} {
				if err := HandFence(ctx, c, n.Object.GetNamespace(), n.Object.GetName(), m.TargetID, m.TargetName); err != nil {
					return err
				}
			}
		}
	}
	for _, n := range g.PauseTargets() {
		if err := setPaused(ctx, m.Target, n.Object, false); err != nil {
			return err
		}
		if err := m.touched(StepUnpause, n.Object); err != nil {
			return err
		}
	}
	return nil
}

// cleanSource deletes what moved from the source, dependents first, and
// turns the mirrors into read-only copies: still paused, annotated with
// the target, and without owner references, so that the source's garbage
// collector does not delete them with their deleted owners. The
// controllers are paused, so nobody would remove the finalizers: the move
// removes them before it deletes.
func (m *Mover) cleanSource(ctx context.Context, g *Graph) error {
	order, err := g.DeleteOrder()
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range order {
		if m.mirror(n.ID()) {
			if err := m.keepMirror(ctx, n.Object); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, n := range order {
		if m.mirror(n.ID()) {
			continue
		}
		if err := deleteWithoutFinalizers(ctx, m.Source, n.Object); err != nil {
			return err
		}
		if err := m.touched(StepCleanSource, n.Object); err != nil {
			return err
		}
	}
	return nil
}

func (m *Mover) keepMirror(ctx context.Context, u *unstructured.Unstructured) error {
	patch := map[string]any{"metadata": map[string]any{
		"annotations":     map[string]any{MirrorAnnotation: m.TargetName},
		"ownerReferences": nil,
	}}
	raw, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if err := m.Source.Patch(ctx, u.DeepCopy(), client.RawPatch(types.MergePatchType, raw)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("keep %s as a mirror: %w", ObjectOf(u), err)
	}
	return nil
}

func deleteWithoutFinalizers(ctx context.Context, c client.Client, u *unstructured.Unstructured) error {
	obj := u.DeepCopy()
	if err := c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("remove the finalizers of %s in the source: %w", ObjectOf(u), err)
	}
	if err := c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s from the source: %w", ObjectOf(u), err)
	}
	return nil
}

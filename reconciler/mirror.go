package reconciler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// pivoting reports whether a pivot stage's move of the deployment has
// started here and not finished: the deployment is suspended by the move,
// which the walk must still carry through. A move by hand (`capstan
// pivot`, no stage) is the command's to carry through: the walk leaves
// it alone.
func pivoting(cd *capstanv1.ClusterDeployment) bool {
	return cd.Status.Pivot != nil && cd.Status.Pivot.Stage != "" && cd.Status.Pivot.Phase != "" && cd.Status.Pivot.Phase != capstanv1.PivotCleanedUp &&
		cd.Annotations[pivot.ArrivedAnnotation] == ""
}

// arriving reports whether the deployment moved here and this Capstan has
// not taken it over yet: its status is the source's, kept as it came.
func arriving(cd *capstanv1.ClusterDeployment) bool {
	return cd.Annotations[pivot.ArrivedAnnotation] != "" && cd.Status.Pivot == nil
}

// moved reports whether the deployment is a mirror of one that moved
// into another cluster: handed over there by a pivot stage, or moved by
// hand (capstan pivot, which ends when the source is clean).
func moved(cd *capstanv1.ClusterDeployment) bool {
	st := cd.Status.Pivot
	if cd.Annotations[pivot.MirrorAnnotation] == "" || st == nil {
		return false
	}
	return st.Phase == capstanv1.PivotCleanedUp || (st.Stage == "" && st.Phase.Reached(capstanv1.PivotSourceCleaned))
}

// refreshMirror copies the status of the deployment, its Clusters and its
// Machines in the target into their read-only mirrors here (seed 000 step
// 10), at most every MirrorInterval. A target that cannot be reached is
// said in status.pivot.message, and tried again at the next interval.
func (r *Reconciler) refreshMirror(ctx context.Context, cd *capstanv1.ClusterDeployment) (reconcile.Result, error) {
	st := cd.Status.Pivot
	every := r.opts.MirrorInterval
	if every <= 0 {
		every = time.Minute
	}
	if st.MirroredAt != nil {
		if wait := st.MirroredAt.Add(every).Sub(r.opts.Now()); wait > 0 {
			return reconcile.Result{RequeueAfter: wait}, nil
		}
	}
	before := cd.DeepCopy()
	now := metav1.NewTime(r.opts.Now())
	err := errors.Join(stages.ReleaseHeld(ctx, r.client, cd), r.mirror(ctx, cd))
	cd.Status.Pivot.MirroredAt = &now
	cd.Status.Pivot.Message = ""
	if err != nil {
		cd.Status.Pivot.Message = truncate(redact("mirror: " + err.Error()))
		log.FromContext(ctx).Info("mirror not refreshed", "error", err.Error())
	}
	if err := r.patchStatus(ctx, before, cd); err != nil {
		return reconcile.Result{}, err
	}
	// The target's Capstan works on the deployment and alerts on it; the
	// mirror here shows its stages but raises nothing of its own.
	r.metrics.RecordSuspended(cd)
	return reconcile.Result{RequeueAfter: every}, nil
}

// mirror reads the target and copies its status into cd and the mirrors.
func (r *Reconciler) mirror(ctx context.Context, cd *capstanv1.ClusterDeployment) error {
	st := cd.Status.Pivot
	if st.KubeConfig == nil {
		return errors.New("the move did not record the kubeconfig of its target")
	}
	// The record is status: its namespace is taken only where the
	// deployment may read Secrets (clusters_rules.go).
	key := clusterKey{namespace: cd.Namespace, secret: st.KubeConfig.Name, key: st.KubeConfig.Key}
	if ns := st.KubeConfigNamespace; ns != "" && ns != cd.Namespace {
		if err := r.clusters.rules.namespaceAllowed(cd, ns, "status.pivot.kubeConfig: Secret "+ns+"/"+key.secret); err != nil {
			return err
		}
		key.namespace = ns
	}
	if key.key == "" {
		key.key = capstanv1.DefaultKubeConfigKey
	}
	cluster, err := r.clusters.get(ctx, cd, key)
	if err != nil {
		return err
	}
	if err := cluster.CheckAvailable(ctx); err != nil {
		return &stages.UnreachableError{Cluster: cluster.Name(), Err: err}
	}
	target := cluster.Client()
	there := &capstanv1.ClusterDeployment{}
	if err := target.Get(ctx, client.ObjectKeyFromObject(cd), there); err != nil {
		return fmt.Errorf("read ClusterDeployment %s/%s in %s: %w", cd.Namespace, cd.Name, cluster.Name(), err)
	}
	pivotRecord := cd.Status.Pivot
	cd.Status = *there.Status.DeepCopy()
	cd.Status.Pivot = pivotRecord

	var errs []error
	for _, ref := range st.Mirrors {
		// The record is status too: a mirror is refreshed, as Capstan,
		// only where the deployment may act (a tenant's namespace, or any
		// for the platform's deployments), never another tenant's object.
		if ref.Namespace != cd.Namespace && !r.clusters.rules.platform(cd) {
			errs = append(errs, fmt.Errorf("status.pivot.mirrors: %s %s/%s is not in the deployment's namespace %s; not refreshed",
				ref.Kind, ref.Namespace, ref.Name, cd.Namespace))
			continue
		}
		if err := copyStatus(ctx, target, r.client, ref); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// copyStatus writes the status of ref in the target onto its mirror here.
func copyStatus(ctx context.Context, from, to client.Client, ref capstanv1.ObjectReference) error {
	src := &unstructured.Unstructured{}
	src.SetAPIVersion(ref.APIVersion)
	src.SetKind(ref.Kind)
	if err := from.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, src); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // gone in the target (a replaced Machine): the mirror keeps its last status
		}
		return fmt.Errorf("read %s %s/%s in the target: %w", ref.Kind, ref.Namespace, ref.Name, err)
	}
	dst := &unstructured.Unstructured{}
	dst.SetAPIVersion(ref.APIVersion)
	dst.SetKind(ref.Kind)
	if err := to.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, dst); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("read mirror %s %s/%s: %w", ref.Kind, ref.Namespace, ref.Name, err)
	}
	status, ok := src.Object["status"]
	if !ok || equality.Semantic.DeepEqual(status, dst.Object["status"]) {
		return nil
	}
	dst.Object["status"] = status
	if err := to.Status().Update(ctx, dst); err != nil {
		return fmt.Errorf("refresh mirror %s %s/%s: %w", ref.Kind, ref.Namespace, ref.Name, err)
	}
	return nil
}

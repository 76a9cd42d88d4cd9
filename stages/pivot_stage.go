package stages

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// BootstrapOnlyLabel marks an object that serves only the building of a
// cluster from the bootstrap cluster (a provider Deployment of the
// bootstrap, say): once the Capstan of the target has taken the
// deployment over, the pivot stage deletes it from the bootstrap cluster.
const BootstrapOnlyLabel = pivot.BootstrapOnlyLabel

// WithHomeDiscovery gives the executor discovery of the cluster Capstan
// runs in, which a pivot stage lists the objects to move with.
func WithHomeDiscovery(d discovery.DiscoveryInterface) ExecutorOption {
	return func(e *Executor) { e.homeDiscovery = d }
}

// WithIdentity says which Capstan the executor writes for: the identity
// of the cluster it runs in (pivot.ClusterID) and a description for
// people. With it every write for a deployment first checks the
// deployment's fencing record in the cluster written to (pivot.CheckFence).
func WithIdentity(id, name string) ExecutorOption {
	return WithIdentityFrom(func(context.Context) (string, string, error) { return id, name, nil })
}

// WithIdentityFrom is WithIdentity with the identity learnt on first use
// (the cluster may not answer when the daemon starts); until it is
// learnt, nothing is written.
func WithIdentityFrom(identify func(context.Context) (id, name string, err error)) ExecutorOption {
	return func(e *Executor) { e.identity = &identity{identify: identify} }
}

// identity is learnt once and shared by every executor On derives.
type identity struct {
	identify func(context.Context) (string, string, error)

	mu       sync.Mutex
	id, name string
}

// get returns the identity, learning it on first use: "" without one.
func (i *identity) get(ctx context.Context) (string, string, error) {
	if i == nil {
		return "", "", nil
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.id == "" {
		id, name, err := i.identify(ctx)
		if err != nil {
			return "", "", err
		}
		i.id, i.name = id, name
	}
	return i.id, i.name, nil
}

// Installer installs Capstan into a cluster a deployment moved into.
type Installer interface {
	// InstallCRDs applies Capstan's CRDs to target, before the move: the
	// ClusterDeployment moves with the rest. It waits until they are
	// established.
	InstallCRDs(ctx context.Context, target Cluster) error
	// Install applies Capstan's manifests to target, with the image of
	// the instance running, and returns what it installed, for status. The
	// root source and its credentials go along only when f.RootSource;
	// otherwise Installed.Withheld says what the target was not given. It
	// does not wait.
	Install(ctx context.Context, target Cluster, f InstallFor) (Installed, error)
}

// WithInstaller lets pivot stages install Capstan into their target.
// Without one (an instance that does not know its image) a pivot waits
// for a Capstan started there by other means.
func WithInstaller(i Installer) ExecutorOption {
	return func(e *Executor) { e.installer = i }
}

// discoverer is a Cluster that can list the kinds it serves.
type discoverer interface {
	Discovery() discovery.DiscoveryInterface
}

// checkFence returns a stalled error when another Capstan owns the
// deployment in the cluster the executor writes to.
func (e *Executor) checkFence(ctx context.Context, owner Owner) error {
	return e.checkFenceFirst(ctx, owner, false)
}

// checkFenceFirst is checkFence; first says that the deployment has most
// likely never written there (none of the objects it is about to apply
// exists), so that its fencing record is claimed with a create before it
// is read: one request instead of two for a new deployment, two instead
// of one should the record exist after all.
func (e *Executor) checkFenceFirst(ctx context.Context, owner Owner, first bool) error {
	if err := e.checkClaim(ctx, owner); err != nil {
		return err
	}
	id, name, err := e.identity.get(ctx)
	if err != nil || id == "" {
		return err
	}
	// A FencedError stalls by its own classification (pivot.ReasonFenced).
	if first {
		return pivot.ClaimFence(ctx, e.own, owner.Namespace, owner.Name, id, name)
	}
	return pivot.CheckFence(ctx, e.own, owner.Namespace, owner.Name, id, name)
}

// readDeployment reads the ClusterDeployment owner in the home cluster.
func (e *Executor) readDeployment(ctx context.Context, owner Owner) (*capstanv1.ClusterDeployment, error) {
	return readDeployment(ctx, e.home, owner)
}

func readDeployment(ctx context.Context, c client.Reader, owner Owner) (*capstanv1.ClusterDeployment, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(capstanv1.GroupVersion.WithKind("ClusterDeployment"))
	if err := c.Get(ctx, client.ObjectKey{Namespace: owner.Namespace, Name: owner.Name}, u); err != nil {
		return nil, err
	}
	cd := &capstanv1.ClusterDeployment{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cd); err != nil {
		return nil, fmt.Errorf("read ClusterDeployment %s/%s: %w", owner.Namespace, owner.Name, err)
	}
	return cd, nil
}

// pivotStage moves the deployment, everything it applied and what the
// controllers made of it from the cluster Capstan runs in into the
// stage's cluster (its kubeConfig), with pivot.Run, then installs
// Capstan there (docs/pivot.md). Every phase done is recorded in the
// deployment's status.pivot, so that a later attempt, after a crash or a
// failed phase, resumes after it. The result is InProgress and applied:
// the handover to the target's Capstan is waited for in WaitStage. In the
// target, where the moved deployment arrives marked, the stage is done
// at once: the Capstan there takes the deployment over and goes on with
// the stages after it.
func (e *Executor) pivotStage(ctx context.Context, stage *Stage, owner Owner) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	cd, err := e.readDeployment(ctx, owner)
	if err == nil && cd.Annotations[pivot.ArrivedAnnotation] != "" {
		return e.takeOver(ctx, stage, owner, cd, cd.Annotations[pivot.ArrivedAnnotation])
	}
	// A stage without a target can never move anything.
	if e.cluster == nil || e.cluster.Name() == LocalClusterName {
		return failed(res, failure.Stalled(ReasonPivotBlocked, fmt.Errorf("stage %s: a pivot stage moves into the cluster its kubeConfig names (for a Cluster API cluster, Secret <cluster>-kubeconfig); it has none", stage.Name)))
	}
	if err != nil {
		return failed(res, fmt.Errorf("stage %s: read ClusterDeployment %s/%s: %w", stage.Name, owner.Namespace, owner.Name, err))
	}
	st := cd.Status.Pivot
	if st != nil && st.Phase != "" && st.Target != e.cluster.Name() {
		return failed(res, failure.Stalled(ReasonPivotBlocked, fmt.Errorf("stage %s: ClusterDeployment %s/%s is being moved into %s (phase %s done), not %s",
			stage.Name, owner.Namespace, owner.Name, st.Target, st.Phase, e.cluster.Name())))
	}
	last := capstanv1.PivotPhase("")
	if st != nil {
		last = st.Phase
	}
	if last.Reached(capstanv1.PivotInstalled) {
		res.Applied = true
		res.Message = "moved into " + e.cluster.Name()
		return res
	}
	targetDisco, ok := e.cluster.(discoverer)
	if !ok || e.homeDiscovery == nil {
		return failed(res, failure.Stalled(ReasonPivotBlocked, fmt.Errorf("stage %s: the executor cannot list the kinds of both clusters", stage.Name)))
	}
	targetID, err := pivot.ClusterID(ctx, e.client)
	if err != nil {
		return failed(res, fmt.Errorf("stage %s: target %s: %w", stage.Name, e.cluster.Name(), err))
	}
	// Until the fencing record goes to the target, this Capstan must own
	// the deployment here; after, the move is the only writer it allows.
	// A move stopped during Unpause may have handed the record to this
	// very target already: that is its own doing, and it resumes.
	if !last.Reached(capstanv1.PivotUnpaused) {
		if err := e.checkFence(ctx, owner); err != nil {
			var fenced *pivot.FencedError
			if !errors.As(err, &fenced) || fenced.Holder != targetID || !last.Reached(capstanv1.PivotCopied) {
				return failed(res, fmt.Errorf("stage %s: %w", stage.Name, err))
			}
		}
	}
	if !last.Reached(capstanv1.PivotSourceCleaned) {
		if err := e.move(ctx, stage, owner, cd, targetID, targetDisco.Discovery()); err != nil {
			return e.pivotFailed(ctx, owner, res, fmt.Errorf("stage %s: %w", stage.Name, err))
		}
	}

	msg := "no Capstan installed by this one (it does not know its image; run it with --image, or start one there): waiting for one to take the deployment over"
	switch {
	case stage.Pivot != nil && stage.Pivot.Install == capstanv1.PivotInstallNever:
		msg = "pivot.install is Never: waiting for the Capstan there to take the deployment over"
	case e.installer != nil:
		done, err := e.installer.Install(ctx, e.cluster, e.installFor(cd))
		if err != nil {
			return e.pivotFailed(ctx, owner, res, fmt.Errorf("stage %s: install Capstan into %s: %w", stage.Name, e.cluster.Name(), err))
		}
		msg = "installed " + done.What + ": waiting for it to take the deployment over"
		if done.Withheld != "" {
			msg += "; " + done.Withheld
		}
	}
	if err := e.recordPivot(ctx, owner, &capstanv1.PivotStatus{Phase: capstanv1.PivotInstalled, Message: msg}); err != nil {
		return failed(res, err)
	}
	res.Applied = true
	res.Message = "moved into " + e.cluster.Name() + "; " + msg
	return res
}

// move runs pivot.Run from the cluster Capstan runs in into the stage's
// cluster. The stage adds to the driver what only a stage does: Capstan's
// CRDs installed into the target before the preflight (the deployment
// moves with the rest), the refusal of objects of Capstan's own namespace,
// and the deployment's credentials held in the source until the handover,
// since the walk here goes on with them until then (pivotWait releases
// them).
func (e *Executor) move(ctx context.Context, stage *Stage, owner Owner, cd *capstanv1.ClusterDeployment,
	targetID string, targetDisco discovery.DiscoveryInterface) error {
	install := e.installer != nil && (stage.Pivot == nil || stage.Pivot.Install != capstanv1.PivotInstallNever)
	_, err := pivot.Run(ctx, pivot.Move{
		Namespace: owner.Namespace, Name: owner.Name,
		Source:   pivot.Cluster{Name: e.sourceName(ctx), Client: e.home, Discovery: e.homeDiscovery},
		Target:   pivot.Cluster{Name: e.cluster.Name(), Client: e.client, Discovery: targetDisco},
		TargetID: targetID,
		Start:    capstanv1.PivotStatus{Stage: stage.Name, KubeConfig: e.kubeConfig, KubeConfigNamespace: e.kubeConfigNamespace},
		Force:    stage.Pivot != nil && stage.Pivot.Force,
		Held:     pivot.HeldSecrets(cd),
		Check:    func(g *pivot.Graph) error { return e.checkCarries(cd, g) },
		BeforePreflight: func(ctx context.Context) error {
			if !install {
				return nil
			}
			if err := e.installer.InstallCRDs(ctx, e.cluster); err != nil {
				return fmt.Errorf("install Capstan's CRDs into %s: %w", e.cluster.Name(), err)
			}
			// What the target serves changed: ask afresh.
			if c, ok := targetDisco.(interface{ Invalidate() }); ok {
				c.Invalidate()
			}
			return nil
		},
	})
	return err
}

// sourceName describes the cluster this Capstan runs in.
func (e *Executor) sourceName(ctx context.Context) string {
	if _, name, _ := e.identity.get(ctx); name != "" {
		return name
	}
	return LocalClusterName
}

// pivotWait waits for the handover: the target's Capstan owning the
// deployment (its fencing record) and having taken it over (its pivot
// stage Ready, its status.pivot naming it). Then it deletes from here
// what the deployment marks bootstrap-only, and the stage is Ready.
func (e *Executor) pivotWait(ctx context.Context, stage *Stage, owner Owner) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	cd, err := e.readDeployment(ctx, owner)
	if err != nil {
		return failed(res, fmt.Errorf("stage %s: read ClusterDeployment %s/%s: %w", stage.Name, owner.Namespace, owner.Name, err))
	}
	if from := cd.Annotations[pivot.ArrivedAnnotation]; from != "" {
		return e.takeOver(ctx, stage, owner, cd, from)
	}
	st := cd.Status.Pivot
	if st == nil || !st.Phase.Reached(capstanv1.PivotInstalled) {
		// The acting part did not finish: another attempt resumes it.
		return failed(res, fmt.Errorf("stage %s: the move stopped after phase %q; resuming", stage.Name, phaseOf(st)))
	}
	if !st.Phase.Reached(capstanv1.PivotHandedOver) {
		msg, ok, err := e.handedOver(ctx, stage, owner, st)
		for !ok && err == nil {
			select {
			case <-ctx.Done():
				res.Message = "moved into " + e.cluster.Name() + "; " + msg
				return res
			case <-time.After(time.Second):
			}
			msg, ok, err = e.handedOver(ctx, stage, owner, st)
		}
		if err != nil {
			return failed(res, fmt.Errorf("stage %s: %w", stage.Name, err))
		}
		if err := e.recordPivot(ctx, owner, &capstanv1.PivotStatus{Phase: capstanv1.PivotHandedOver, Message: msg}); err != nil {
			return failed(res, err)
		}
	}
	if !st.Phase.Reached(capstanv1.PivotCleanedUp) {
		left, err := e.cleanUpBootstrap(ctx, stage)
		for len(left) > 0 && err == nil {
			select {
			case <-ctx.Done():
				res.Message = "handed over to the Capstan of " + e.cluster.Name() + "; removing the bootstrap-only objects: " + strings.Join(left, ", ")
				return res
			case <-time.After(time.Second):
			}
			left, err = e.cleanUpBootstrap(ctx, stage)
		}
		if err != nil {
			return failed(res, fmt.Errorf("stage %s: %w", stage.Name, err))
		}
		if err := e.recordPivot(ctx, owner, &capstanv1.PivotStatus{Phase: capstanv1.PivotCleanedUp, Message: ""}); err != nil {
			return failed(res, err)
		}
	}
	// An error here is the mirror's refresh's to retry.
	_ = ReleaseHeld(ctx, e.home, cd)
	res.State = capstanv1.StageReady
	res.Moved = true
	res.Message = fmt.Sprintf("moved %d objects into %s and handed over to the Capstan there", st.Objects, st.Target)
	return res
}

// pivotFailed records err in status.pivot.message, beside the phase the
// next attempt resumes after, and fails the attempt with it.
func (e *Executor) pivotFailed(ctx context.Context, owner Owner, res Result, err error) Result {
	msg := err.Error()
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	if rerr := e.recordPivot(ctx, owner, &capstanv1.PivotStatus{Message: msg}); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return failed(res, err)
}

func phaseOf(st *capstanv1.PivotStatus) capstanv1.PivotPhase {
	if st == nil {
		return ""
	}
	return st.Phase
}

// handedOver says whether the target's Capstan has taken the deployment
// over, and if not, what is waited for.
func (e *Executor) handedOver(ctx context.Context, stage *Stage, owner Owner, st *capstanv1.PivotStatus) (string, bool, error) {
	if res, down := e.checkAvailable(ctx, stage); down {
		return res.Message, false, nil
	}
	holder, err := pivot.FenceHolder(ctx, e.client, owner.Namespace, owner.Name)
	if err != nil {
		return "", false, err
	}
	if holder != st.Owner {
		return "", false, fmt.Errorf("the fencing record of ClusterDeployment %s/%s in %s names %q, not the target's Capstan %q: was it handed elsewhere?",
			owner.Namespace, owner.Name, e.cluster.Name(), holder, st.Owner)
	}
	there, err := readDeployment(ctx, e.client, owner)
	if apierrors.IsNotFound(err) {
		return "", false, fmt.Errorf("ClusterDeployment %s/%s is not in %s any more", owner.Namespace, owner.Name, e.cluster.Name())
	}
	if err != nil {
		return "", false, err
	}
	waiting := "waiting for the Capstan of " + e.cluster.Name() + " to take the deployment over"
	if strings.HasPrefix(st.Message, "installed ") {
		waiting += " (" + strings.SplitN(st.Message, ":", 2)[0] + ")"
	}
	if there.Status.Pivot == nil || there.Status.Pivot.Owner != st.Owner {
		return waiting, false, nil
	}
	for _, s := range there.Status.Stages {
		if s.Name == stage.Name && s.State == capstanv1.StageReady {
			return "the Capstan of " + e.cluster.Name() + " owns the deployment", true, nil
		}
	}
	return waiting, false, nil
}

// ReleaseHeld deletes from the cluster c reaches the copies of the
// Secrets a move of cd held there for the walk until the handover (its
// source's credentials, the bootstrap key). It runs after the cleanup is
// recorded, and again at each refresh of the mirror: a restart between
// the two must find the credentials still there to finish the walk, and
// the copies gone in the end.
func ReleaseHeld(ctx context.Context, c client.Client, cd *capstanv1.ClusterDeployment) error {
	shared, err := pivot.SharedSecrets(ctx, c, cd.Namespace, cd.Name)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range pivot.HeldSecrets(cd) {
		if shared[name] {
			continue
		}
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: cd.Namespace, Name: name}}
		if err := c.Delete(ctx, secret); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete the copy of Secret %s/%s held for the move: %w", cd.Namespace, name, err))
		}
	}
	return errors.Join(errs...)
}

// cleanUpBootstrap deletes from the cluster Capstan runs in the objects of
// the deployment labelled bootstrap-only, and returns those still there
// (finalizers) by name.
func (e *Executor) cleanUpBootstrap(ctx context.Context, stage *Stage) ([]string, error) {
	var left []string
	var errs []error
	objects := stage.PlanObjects
	for _, obj := range objects {
		if obj.GetLabels()[BootstrapOnlyLabel] != "true" {
			continue
		}
		target := &unstructured.Unstructured{}
		target.SetGroupVersionKind(obj.GroupVersionKind())
		target.SetNamespace(obj.GetNamespace())
		target.SetName(obj.GetName())
		err := e.home.Get(ctx, client.ObjectKeyFromObject(target), target)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", ObjectRef(obj), err))
			continue
		}
		left = append(left, ObjectRef(obj))
		if target.GetDeletionTimestamp() != nil {
			continue
		}
		if err := e.home.Delete(ctx, target, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s: %w", ObjectRef(obj), err))
		}
	}
	return left, errors.Join(errs...)
}

// takeOver is the pivot stage in the target: the deployment arrived, this
// Capstan checks that it owns it (the move handed it the fencing record)
// and says so in status.pivot, which the source's Capstan waits for.
func (e *Executor) takeOver(ctx context.Context, stage *Stage, owner Owner, cd *capstanv1.ClusterDeployment, from string) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	if err := e.checkClaim(ctx, owner); err != nil {
		return failed(res, fmt.Errorf("stage %s: %w", stage.Name, err))
	}
	id, name, err := e.identity.get(ctx)
	if err != nil {
		return failed(res, fmt.Errorf("stage %s: %w", stage.Name, err))
	}
	if id != "" {
		if err := pivot.CheckFence(ctx, e.home, owner.Namespace, owner.Name, id, name); err != nil {
			return failed(res, fmt.Errorf("stage %s: %w", stage.Name, err))
		}
		if cd.Status.Pivot == nil || cd.Status.Pivot.Owner != id {
			rec := &capstanv1.PivotStatus{Target: "here", Stage: stage.Name, Owner: id, Phase: capstanv1.PivotHandedOver,
				Message: "moved here from " + from + "; owned by this Capstan"}
			if err := e.recordPivot(ctx, owner, rec); err != nil {
				return failed(res, err)
			}
		}
	}
	res.State = capstanv1.StageReady
	res.Message = "moved here from " + from
	return res
}

// recordPivot merges rec's set fields into the deployment's status.pivot
// in the home cluster, with the time of the phase when it sets one. The
// last phase clears the message.
func (e *Executor) recordPivot(ctx context.Context, owner Owner, rec *capstanv1.PivotStatus) error {
	var clear []string
	if rec.Message == "" && rec.Phase == capstanv1.PivotCleanedUp {
		clear = append(clear, "message")
	}
	return RecordPivot(ctx, e.home, owner.Namespace, owner.Name, rec, clear...)
}

// RecordPivot is pivot.Record: it merges rec's set fields into
// status.pivot of the ClusterDeployment namespace/name.
func RecordPivot(ctx context.Context, c client.Client, namespace, name string, rec *capstanv1.PivotStatus, clear ...string) error {
	return pivot.Record(ctx, c, namespace, name, rec, clear...)
}

package reconciler

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// DefaultInterval is how often a deployment's source is polled when its
// spec sets no interval.
const DefaultInterval = time.Minute

// Stats counts the expensive things the reconciler did, for tests and
// benchmarks that assert a no-op reconcile stays a no-op.
type Stats struct {
	Fetches int64
	Renders int64
}

// Reconciler walks the stages of one ClusterDeployment per call.
type Reconciler struct {
	client   client.Client
	executor *stages.Executor
	// actors act as the deployments' ServiceAccounts (impersonate.go);
	// nil: Capstan acts as itself for every deployment.
	actors   *actors
	sources  *sourceCache
	clusters *clusterCache
	drift    *driftWatcher
	plans    planCache
	events   recorder.EventRecorder
	metrics  *metrics.Collector
	opts     ReconcilerOptions
	report   statusNotifier // status commits (report.go); nil: none

	fetches  atomic.Int64
	renders  atomic.Int64
	failures failureCounter
	// stalls remembers the input each stalled deployment stalled on.
	stalls stallMemo
	// unreachable counts the consecutive attempts a deployment's stage
	// waited for its cluster, for the backoff; they are not failures.
	unreachable failureCounter
}

// ReconcilerOptions tune the loop.
type ReconcilerOptions struct {
	// DefaultServiceAccount is the ServiceAccount, in each deployment's
	// namespace, that Capstan acts as for deployments that name none
	// (spec.serviceAccountName); empty: Capstan's own identity.
	DefaultServiceAccount string
	// DecryptionSecret names the Secret, in the deployment's namespace,
	// holding the sops keys of deployments of the root source that set no
	// spec.decryption (capstan run --decryption-secret); empty: none.
	DecryptionSecret string
	// WaitSlice bounds how long one attempt waits on watch events for a
	// stage to become ready before it records progress and yields.
	WaitSlice time.Duration
	// RetryBase and RetryMax bound the exponential backoff after a failure.
	RetryBase, RetryMax time.Duration
	// Now returns the current time (for tests).
	Now func() time.Time
	// MirrorInterval is how often the mirrors a move leaves behind take
	// the status of the deployment and Cluster API objects in the target.
	MirrorInterval time.Duration
}

// DefaultReconcilerOptions returns the options the daemon runs with.
func DefaultReconcilerOptions() ReconcilerOptions {
	return ReconcilerOptions{
		WaitSlice: 30 * time.Second,
		RetryBase: time.Second,
		RetryMax:  5 * time.Minute,
		Now:       time.Now,

		MirrorInterval: time.Minute,
	}
}

// Stats returns what the reconciler has done so far.
func (r *Reconciler) Stats() Stats {
	return Stats{Fetches: r.fetches.Load(), Renders: r.renders.Load()}
}

// attempt carries one reconcile's state from step to step.
type attempt struct {
	cd *capstanv1.ClusterDeployment
	// written is cd as the API server last had it: as read, then as each
	// status write answered. saveStatus writes what cd has more, so that
	// a change made in one step may wait for the write of a later one
	// (the preflight's verdict goes with the walk's first write).
	written  *capstanv1.ClusterDeployment
	source   *sourceEntry
	revision string
	artifact *sources.Artifact
	objects  []*unstructured.Unstructured
	// rendered is the render of this attempt: the file of each object
	// and the variables left unset, for preflight; nil when the plan came
	// from the cache.
	rendered *render.Result
	plan     *stages.Plan
	// requeue is when to come back; zero means the poll interval.
	requeue time.Duration
	// outcome is how the attempt ended, for metrics. A stage still
	// waiting is a success.
	outcome metrics.Outcome
	// driftOnly is set when nothing changed but applied objects drifted:
	// the attempt corrects them and walks no stage.
	driftOnly bool
	// verify is set with driftOnly on the first look at a Ready
	// deployment since this Capstan took it (a start, a new leader, a
	// handover): every object it applied is checked once with a dry run,
	// which finds what changed while no Capstan watched (verifyDesired).
	verify bool
	// planned is set when the plan of this revision was at hand: nothing
	// is rendered again.
	planned bool
	// refetch is set when a reconcile request asks for the source's
	// content again (requests.go): nothing cached is used, and an
	// unchanged revision is walked again.
	refetch bool
	// sourceFailed is set when the source could not be checked or
	// fetched: conclude reports it in SourceReady, not Ready.
	sourceFailed bool
	// stageRecorded is set when the attempt ends on a stage that failed
	// or waits for its cluster: the walk recorded it in the stage's
	// status, the Ready condition and a StageFailed event already.
	stageRecorded bool
	// requested is the reconcile request the attempt answers, "" for
	// none (requests.go).
	requested string
	// pending is set when the attempt ended to wait for its source (a
	// check or fetch under way in the source cache, sourceops.go): it
	// wrote nothing, answered no request, and is woken when the source
	// answers.
	pending bool
	// release lets the store evict the artifact once the attempt is done
	// with it; nil when none is pinned.
	release func()
}

// step is one part of a reconcile. done ends the walk early without error.
type step func(ctx context.Context, a *attempt) (done bool, err error)

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	cd := &capstanv1.ClusterDeployment{}
	if err := r.client.Get(ctx, req.NamespacedName, cd); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.Namespace, req.Name)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !cd.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, cd)
	}
	if moved(cd) || (cd.Spec.Suspend && !pivoting(cd)) {
		// Nothing here corrects the objects of a mirror or of a
		// suspended deployment.
		r.drift.forget(client.ObjectKeyFromObject(cd))
	}
	if moved(cd) {
		// A mirror of a deployment that moved into another cluster: its
		// status follows the target's; nothing is applied.
		return r.refreshMirror(ctx, cd)
	}
	if cd.Spec.Suspend && !pivoting(cd) {
		// A move suspends the deployment here first; the walk resumes
		// it (the pivot stage) after a restart, and nothing else.
		r.metrics.RecordSuspended(cd)
		return reconcile.Result{}, nil
	}
	if err := r.ensureFinalizer(ctx, cd); err != nil {
		return reconcile.Result{}, err
	}
	begin := time.Now()
	requested, refetch := pendingRequest(cd)
	a := &attempt{cd: cd, written: cd.DeepCopy(), outcome: metrics.OutcomeSuccess, refetch: refetch, requested: requested}
	res, err := r.runSteps(ctx, a)
	if a.pending {
		// Nothing was decided: the attempt that takes the source's
		// answer answers the request.
		return res, err
	}
	r.markHandled(ctx, a.cd, requested)
	r.metrics.RecordStages(a.cd)
	r.metrics.ObserveReconcile(a.cd, time.Since(begin), a.outcome)
	return res, err
}

func (r *Reconciler) runSteps(ctx context.Context, a *attempt) (reconcile.Result, error) {
	// Dependencies are checked before anything is fetched or rendered: a
	// deployment waiting for another costs one remote check and the reads
	// of its dependencies.
	// Each step but the walk is a batch of API requests (the preflight's
	// dry runs, drift corrections, Secret reads) or waits for nothing
	// remote: bounded by spec.timeout. The walk bounds each batch of its
	// own and waits for stages as long as they must (docs/deadlines.md).
	steps := []step{bounded(r.checkSource), bounded(r.checkDependencies), bounded(r.fetchArtifact), bounded(r.renderObjects),
		r.buildPlan, bounded(r.driftOnly), bounded(r.preflight), r.walkStages}
	defer a.unpin()
	for _, s := range steps {
		done, err := s(ctx, a)
		if err != nil {
			return r.conclude(ctx, a, err)
		}
		if done {
			break
		}
	}
	// What a step left for a later write that did not come (none does
	// today: the walk writes at its end); an unchanged status costs
	// nothing. An attempt that waits for its source writes nothing.
	if !a.pending {
		if err := r.saveStatus(ctx, a); err != nil {
			return r.conclude(ctx, a, err)
		}
	}
	return reconcile.Result{RequeueAfter: r.requeueAfter(a)}, nil
}

// forget drops what the reconciler keeps of a deployment that is gone:
// its metric series, its failure count and its connections to other
// clusters.
func (r *Reconciler) forget(namespace, name string) {
	r.metrics.Forget(namespace, name)
	r.failures.reset(types.NamespacedName{Namespace: namespace, Name: name})
	r.stalls.forget(types.NamespacedName{Namespace: namespace, Name: name})
	r.unreachable.reset(types.NamespacedName{Namespace: namespace, Name: name})
	if r.clusters != nil {
		r.clusters.forget(namespace, name)
	}
	if r.actors != nil {
		r.actors.forget(namespace + "/" + name)
	}
	r.drift.forget(types.NamespacedName{Namespace: namespace, Name: name})
	r.plans.drop(types.NamespacedName{Namespace: namespace, Name: name})
	r.sources.forget(types.NamespacedName{Namespace: namespace, Name: name}) // and its artifact
}

func (r *Reconciler) requeueAfter(a *attempt) time.Duration {
	if a.requeue > 0 {
		return a.requeue
	}
	return interval(a.cd)
}

func interval(cd *capstanv1.ClusterDeployment) time.Duration {
	if cd.Spec.Interval != nil && cd.Spec.Interval.Duration > 0 {
		return cd.Spec.Interval.Duration
	}
	return DefaultInterval
}

// checkSource asks the remote for its revision, and ends the reconcile
// when nothing changed since the last complete walk: same revision, same
// generation, every stage Ready, or stalled on this very input. That no-op
// costs one remote check and no API write. A source that cannot be asked
// is a source failure (conclude): SourceReady says so, Ready stays.
func (r *Reconciler) checkSource(ctx context.Context, a *attempt) (bool, error) {
	src, err := r.sourceFor(ctx, a.cd)
	if err != nil {
		a.sourceFailed = true
		return false, err
	}
	a.source = src
	key := client.ObjectKeyFromObject(a.cd)
	if a.refetch && r.sources.refetchOnce(key, a.requested) {
		r.refetch(a)
	}
	ans, pending := src.revisionFor(key, revisionMaxAge(a.cd), a.cd.Spec.TimeoutOrDefault())
	if pending {
		return r.waitForSource(a)
	}
	rev, err := ans.revision, ans.err
	r.metrics.ObserveSource(a.cd, metrics.SourceObservation{
		Operation: metrics.SourceRevision, Duration: ans.took, Revision: rev, Interval: interval(a.cd), Err: err,
	})
	if err != nil {
		a.sourceFailed = true
		return false, fmt.Errorf("check source: %w", sources.Unavailable(err))
	}
	a.revision = rev
	r.sourceSucceeded(a.cd, rev)
	if !r.unchanged(a) {
		return false, nil
	}
	// Nothing to walk. Status may have news all the same, that the source
	// answers again; otherwise this costs no write.
	if err := r.saveStatus(ctx, a); err != nil {
		return false, err
	}
	return r.correctIfDrifted(ctx, a)
}

// unchanged reports whether the revision and generation are those of the
// last complete walk (Ready), or of the input the deployment stalled on.
func (r *Reconciler) unchanged(a *attempt) bool {
	st, rev := a.cd.Status, a.revision
	if st.Revision != rev || st.ObservedGeneration != a.cd.Generation || a.refetch {
		return false
	}
	if conditionTrue(a.cd, capstanv1.ConditionReady) {
		return true
	}
	if conditionTrue(a.cd, capstanv1.ConditionStalled) && r.stalls.stalledOn(client.ObjectKeyFromObject(a.cd), rev, a.cd.Generation) {
		// Still stalled on the same input: no retry, but still a
		// failure, so that alerts on failing deployments see it.
		a.outcome = metrics.OutcomeStalled
		return true
	}
	return false
}

// correctIfDrifted ends the reconcile of an unchanged deployment, unless
// objects it applied drifted: then they are corrected from what this
// revision applies, rendered again if it is not at hand (driftOnly).
func (r *Reconciler) correctIfDrifted(ctx context.Context, a *attempt) (bool, error) {
	if !conditionTrue(a.cd, capstanv1.ConditionReady) {
		return true, nil
	}
	key := client.ObjectKeyFromObject(a.cd)
	r.drift.track(a.cd)
	set := r.drift.desiredFor(key, a.revision, a.cd.Generation)
	if set == nil && r.drift != nil && a.cd.Spec.Drift != capstanv1.DriftIgnore {
		// No walk of this revision in this process: the watch did not see
		// what happened before it started, and a field taken or removed
		// then looks like any other write. Check every object once.
		a.driftOnly, a.verify = true, true
		return false, nil
	}
	if !r.drift.has(key) {
		return true, nil
	}
	if set != nil {
		return true, r.correctDrift(ctx, a.cd, set, r.drift.take(key))
	}
	a.driftOnly = true
	return false, nil
}

func (r *Reconciler) renderObjects(ctx context.Context, a *attempt) (bool, error) {
	if p, ok := r.plans.get(client.ObjectKeyFromObject(a.cd), a.revision, a.cd.Generation); ok {
		a.objects, a.plan, a.planned = p.objects, p.plan, true
		return false, nil
	}
	r.renders.Add(1)
	opts := render.DefaultOptions()
	opts.Path = a.cd.Spec.Path
	opts.Substitute = a.cd.Spec.Substitute
	bootstrapKey, err := r.bootstrapKey(ctx, a.cd)
	if err != nil {
		return false, err
	}
	if bootstrapKey != "" {
		opts.Substitute = maps.Clone(opts.Substitute)
		if opts.Substitute == nil {
			opts.Substitute = map[string]string{}
		}
		opts.Substitute[stages.BootstrapKeyVar] = bootstrapKey
	}
	// Nothing is applied before the keys are read: a missing Secret
	// stalls the deployment here, naming it.
	if opts.Decrypt, err = r.decryptionKeys(ctx, a.cd); err != nil {
		return false, err
	}
	rendered, err := r.render(ctx, a, opts) // bounded: sourcecache.go
	if err != nil {
		err = decryptionRetry(fmt.Errorf("render %s at %s: %w", a.cd.Spec.Path, a.revision, err))
		if ctx.Err() != nil {
			return false, err // the attempt ended, not the render
		}
		// A render past spec.timeout carries its own policy (retried).
		return false, failure.Default(err, render.ReasonRenderFailed, failure.PolicyStalled)
	}
	// Variables left unset are reported by preflight, with every other
	// problem of the revision.
	objs := rendered.Objects
	a.rendered = rendered
	if bootstrapKey != "" && !anyHolds(objs, bootstrapKey) {
		return false, failure.Stalled(ReasonBootstrapKeyUnused, fmt.Errorf("render %s at %s: no object carries the bootstrap SSH key; "+
			"this plan always adds it to the cluster: put ${%s} in the machines' authorized keys "+
			"(e.g. KubeadmControlPlane spec.kubeadmConfigSpec.users[].sshAuthorizedKeys, or sshAuthorizedKeys of the network ConfigMap)",
			a.cd.Spec.Path, a.revision, stages.BootstrapKeyVar))
	}
	a.objects = objs
	return false, nil
}

// bootstrapKey returns the public bootstrap SSH key when the deployment's
// plan has a stage that hands it to the cluster, creating the key the first
// time; "" otherwise.
func (r *Reconciler) bootstrapKey(ctx context.Context, cd *capstanv1.ClusterDeployment) (string, error) {
	if !stages.NeedsBootstrapKey(cd.Spec) {
		return "", nil
	}
	return r.executor.EnsureBootstrapKey(ctx, cd.Namespace)
}

// anyHolds reports whether some object contains s in one of its string
// fields.
func anyHolds(objs []*unstructured.Unstructured, s string) bool {
	var holds func(v any) bool
	holds = func(v any) bool {
		switch v := v.(type) {
		case string:
			return strings.Contains(v, s)
		case map[string]any:
			for _, e := range v {
				if holds(e) {
					return true
				}
			}
		case []any:
			for _, e := range v {
				if holds(e) {
					return true
				}
			}
		}
		return false
	}
	for _, obj := range objs {
		if holds(obj.Object) {
			return true
		}
	}
	return false
}

func (r *Reconciler) buildPlan(_ context.Context, a *attempt) (bool, error) {
	if a.planned {
		return false, nil
	}
	specs, err := stages.StageSpecs(a.cd.Spec)
	if err != nil {
		return false, failure.Stalled(failure.ReasonOf(err, ReasonPlanInvalid), err)
	}
	plan, err := stages.BuildPlan(specs, a.objects)
	if err != nil {
		return false, failure.Stalled(failure.ReasonOf(err, ReasonPlanInvalid), fmt.Errorf("plan: %w", err))
	}
	if a.cd.Annotations[pivot.ArrivedAnnotation] != "" {
		// The deployment was moved here: what served only its building
		// from the bootstrap cluster stays there, at every revision.
		plan.Drop(func(obj *unstructured.Unstructured) bool {
			return obj.GetLabels()[stages.BootstrapOnlyLabel] == "true"
		})
	}
	a.plan = plan
	r.plans.put(client.ObjectKeyFromObject(a.cd), cachedPlan{revision: a.revision, generation: a.cd.Generation, objects: a.objects, plan: plan})
	return false, nil
}

// driftOnly corrects the objects that drifted of a deployment that is
// Ready at this revision, and ends the attempt.
func (r *Reconciler) driftOnly(ctx context.Context, a *attempt) (bool, error) {
	if !a.driftOnly {
		return false, nil
	}
	defer r.plans.drop(client.ObjectKeyFromObject(a.cd))
	return true, r.correctFromPlan(ctx, a)
}

func (r *Reconciler) backoff(attempts int) time.Duration {
	d := r.opts.RetryBase
	for i := 1; i < attempts && d < r.opts.RetryMax; i++ {
		d *= 2
	}
	return min(d, r.opts.RetryMax)
}

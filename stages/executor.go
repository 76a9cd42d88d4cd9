package stages

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/fluxcd/pkg/ssa"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// FieldManager is the server-side apply field manager Capstan applies with.
const FieldManager = "capstan"

// OwnerGroup prefixes the labels that tie applied objects to their
// ClusterDeployment: capstan.dev/name and capstan.dev/namespace.
const OwnerGroup = "capstan.dev"

// Owner is the ClusterDeployment a stage runs for.
type Owner struct {
	Name      string
	Namespace string
}

// Result is what one attempt at a stage did and where it left the stage.
type Result struct {
	// Stage is the stage's name.
	Stage string
	// State is StageReady, StageInProgress (applied, still waiting; not a
	// failure) or StageFailed (this attempt failed; Err says why).
	State capstanv1.StageState
	// Message says what the stage waits for or why it failed.
	Message string
	// Progress counts what the stage has done, when the attempt knows:
	// its objects ready, its machines rolled out. Nil otherwise.
	Progress *capstanv1.StageProgress
	// ChangeSet lists what the apply created, configured or left unchanged.
	ChangeSet *ssa.ChangeSet
	// Applied is true when this attempt applied every object of the stage.
	Applied bool
	// Err is set when State is StageFailed. IsStalled(Err) tells whether
	// retrying can help. With StageInProgress it is set only when the
	// stage's cluster cannot be reached (IsUnreachable): the stage waits
	// for it, which is not a failure.
	Err error
	// Moved is true when a pivot stage moved the deployment into another
	// cluster: the Capstan there goes on with the stages after it, and
	// this one stops walking (the deployment here is a suspended mirror).
	Moved bool

	// observed holds the objects as the API server returned them from the
	// apply (or its dry run), one per object of the stage, when Applied:
	// what the wait looks at first, without asking again.
	observed []*unstructured.Unstructured
}

// Executor applies and waits for one stage at a time, on one cluster: the
// one it was built with, or the one On gives it.
type Executor struct {
	cluster Cluster
	client  client.WithWatch
	manager *ssa.ResourceManager
	// home is the cluster Capstan runs in, where the ClusterDeployments
	// and their Secrets (the bootstrap key) live, whichever cluster the
	// stage acts on.
	home        client.Client
	concurrency int
	// homeDiscovery lists the kinds the home cluster serves, for a pivot.
	homeDiscovery discovery.DiscoveryInterface
	// identity identifies the Capstan writing (WithIdentity).
	identity  *identity
	installer Installer
	// claim, when set, is asked before every write (WithClaim).
	claim func(context.Context, Owner) error
	// kubeConfig and kubeConfigNamespace say where the connection to
	// cluster was read from, when it is not the home cluster.
	kubeConfig          *capstanv1.SecretKeyReference
	kubeConfigNamespace string
	// own is Capstan's own identity in the cluster acted on, for its own
	// records there (the fencing record): client, unless As gave the
	// executor another identity.
	own client.Client
	// actor is the ServiceAccount ("namespace/name") the executor acts as
	// (As); empty: Capstan's own identity.
	actor string
	// homeNamespace is the namespace Capstan runs in (WithHomeNamespace).
	homeNamespace string
	// batchTimeout bounds each batch of API requests (an apply wave: its
	// look, dry runs and applies); zero: ctx alone (RunOptions.BatchTimeout).
	batchTimeout time.Duration
	// namespaces remembers the namespaces the preflight found in the
	// cluster Capstan runs in, shared by the executors On and As make.
	namespaces *namespaceMemo
}

// ExecutorOption configures an Executor.
type ExecutorOption func(*Executor)

// WithConcurrency sets how many objects are applied in parallel (default 16).
func WithConcurrency(n int) ExecutorOption {
	return func(e *Executor) {
		if n > 0 {
			e.concurrency = n
		}
	}
}

// NewExecutor returns an Executor that acts on the cluster Capstan runs
// in, through c.
func NewExecutor(c client.WithWatch, opts ...ExecutorOption) *Executor {
	e := &Executor{home: c, concurrency: 16, namespaces: &namespaceMemo{}}
	e.bind(LocalCluster(c))
	for _, o := range opts {
		o(e)
	}
	return e
}

// On returns an executor with e's settings that applies, waits and
// validates on cluster c, with the identity c's client has there (not the
// ServiceAccount e acts as, which bounds only the cluster Capstan runs
// in). It is cheap: the reconciler calls it per stage.
func (e *Executor) On(c Cluster) *Executor {
	on := *e
	on.bind(c)
	on.actor = ""
	return &on
}

// Via records the kubeconfig Secret the executor's cluster was reached
// through (namespace, name, key): a pivot stage records it, so that the
// source can reach the target again later.
func (e *Executor) Via(namespace, name, key string) *Executor {
	e.kubeConfig = &capstanv1.SecretKeyReference{Name: name, Key: key}
	e.kubeConfigNamespace = namespace
	return e
}

// As returns an executor with e's settings that acts on the cluster
// Capstan runs in as the identity of c (a client that impersonates a
// deployment's ServiceAccount): the deployment's objects are read,
// dry-run, applied and deleted through c, while Capstan's own records
// there (the fencing record) keep e's identity, as do its reads of the
// ClusterDeployments. actor names the identity in messages
// ("namespace/name" of the ServiceAccount).
func (e *Executor) As(c client.WithWatch, actor string) *Executor {
	own := e.own
	as := e.On(LocalCluster(c))
	as.own, as.actor = own, actor
	return as
}

// Cluster is the cluster the executor acts on.
func (e *Executor) Cluster() Cluster { return e.cluster }

func (e *Executor) bind(c Cluster) {
	e.cluster = c
	e.client = c.Client()
	e.own = e.client
	e.manager = nil
	if e.client != nil {
		e.manager = ssa.NewResourceManager(e.client, nil, ssa.Owner{Field: FieldManager, Group: OwnerGroup})
	}
}

// RunOptions tune one attempt at a stage.
type RunOptions struct {
	// SkipApply only waits: the objects were applied by an earlier attempt
	// at the same revision.
	SkipApply bool
	// Wait bounds the wait that follows the apply (the apply itself is
	// bounded by ctx only). Zero waits until ctx ends.
	Wait time.Duration
	// FirstLook, when set, makes the attempt report what the stage waits
	// for (through Progress) once it has waited this long, then go on
	// waiting: status says what is awaited while the attempt still waits.
	FirstLook time.Duration
	// Progress, when set, is told what the attempt did while it goes on:
	// the apply (a result with Applied), when the attempt waits after it,
	// and the first look. What ends the attempt (a failed apply, a stage
	// Ready in the apply's answers, the end of the wait) is Run's return
	// value, not reported here. An error from Progress ends the attempt:
	// Run returns at once.
	Progress func(Result) error
	// DryRuns, when set, holds the preflight's dry-run answers for the
	// stage's objects (PreflightOptions.Keep): the apply uses them instead
	// of dry-running again the objects they are still about.
	DryRuns *DryRuns
	// BatchTimeout, when set, bounds each batch of API requests of the
	// attempt: each apply wave (its look, dry runs, applies and their
	// rollback), the deployment's spec.timeout. A batch cut short fails
	// the attempt as a cluster that does not answer, retried. The wait
	// is not a batch: Wait bounds it.
	BatchTimeout time.Duration
}

// Run makes one attempt at a stage: carry out its action (apply its
// objects, for an apply stage), then wait on watch events until it is done
// (every readiness check holds). A stage still waiting when the wait ends
// is returned InProgress with what it waits for, which is not a failure.
//
// Objects that the apply found or left ready (a ConfigMap, a CRD already
// established) are not asked for again: a stage whose every object is
// ready in the apply's answers is Ready without a wait.
func (e *Executor) Run(ctx context.Context, stage *Stage, owner Owner, opts RunOptions) Result {
	report := func(res Result) bool {
		return opts.Progress == nil || opts.Progress(res) == nil
	}
	if opts.BatchTimeout > 0 {
		bounded := *e
		bounded.batchTimeout = opts.BatchTimeout
		e = &bounded
	}
	var applied Result
	if !opts.SkipApply {
		applied = e.applyStageWith(ctx, stage, owner, opts.DryRuns)
		if applied.State == capstanv1.StageFailed || IsUnreachable(applied.Err) {
			return applied
		}
		if applied.Applied {
			if res, ok := e.readyAsApplied(stage, applied); ok {
				return res
			}
		}
		if !report(applied) {
			return applied
		}
	}
	waitCtx := ctx
	if opts.Wait > 0 {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithTimeout(ctx, opts.Wait)
		defer cancel()
	}
	finish := func(res Result) Result {
		res.ChangeSet, res.Applied = applied.ChangeSet, applied.Applied
		res.Moved = res.Moved || applied.Moved
		return res
	}
	if opts.FirstLook > 0 {
		lookCtx, cancel := context.WithTimeout(waitCtx, opts.FirstLook)
		res := e.WaitStage(lookCtx, stage, owner)
		cancel()
		if res.State != capstanv1.StageInProgress || IsUnreachable(res.Err) || waitCtx.Err() != nil {
			return finish(res)
		}
		if !report(res) {
			return finish(res)
		}
	}
	return finish(e.WaitStage(waitCtx, stage, owner))
}

// readyAsApplied decides an applied stage from the objects as the apply
// returned them: Ready when the stage's readiness checks hold for every
// one, without a request. Otherwise the wait decides (false).
func (e *Executor) readyAsApplied(stage *Stage, applied Result) (Result, bool) {
	if stage.Action != capstanv1.StageActionApply && stage.Action != "" {
		return Result{}, false
	}
	if len(applied.observed) != len(stage.Objects) || stage.BootstrapKey != nil {
		return Result{}, false
	}
	checker, err := NewChecker(stage.ReadyWhen)
	if err != nil {
		return Result{}, false
	}
	for _, obj := range applied.observed {
		// An object applied in another version than its checks read is
		// left to the wait, which reads it in theirs.
		if obj == nil || checker.ReadAs(obj.GroupVersionKind()) != obj.GroupVersionKind() || !checker.Evaluate(obj).Ready {
			return Result{}, false
		}
	}
	return Result{Stage: stage.Name, State: capstanv1.StageReady, ChangeSet: applied.ChangeSet, Applied: true,
		Progress: objectsReady(len(stage.Objects), len(stage.Objects))}, true
}

// ApplyStage carries out the acting part of a stage: apply its objects
// (apply), check them (validate), set replicas (scale), delete them
// (delete). Wait and rollout stages act in WaitStage. An action the
// executor cannot carry out yet fails as stalled. The result is
// StageInProgress (done, readiness unknown) or StageFailed.
func (e *Executor) ApplyStage(ctx context.Context, stage *Stage, owner Owner) Result {
	return e.applyStageWith(ctx, stage, owner, nil)
}

// applyStageWith is ApplyStage with the preflight's dry-run answers
// (RunOptions.DryRuns).
func (e *Executor) applyStageWith(ctx context.Context, stage *Stage, owner Owner, dry *DryRuns) Result {
	if res, down := e.checkAvailable(ctx, stage); down {
		return res
	}
	return e.unreachableAsWaiting(e.applyStage(ctx, stage, owner, dry))
}

func (e *Executor) applyStage(ctx context.Context, stage *Stage, owner Owner, dry *DryRuns) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	if writes(stage.Action) {
		first := stage.Action != capstanv1.StageActionDelete && dry.allAbsent(stage.Name, stage.Objects, time.Now())
		if err := e.checkFenceFirst(ctx, owner, first); err != nil {
			return failed(res, fmt.Errorf("stage %s: %w", stage.Name, err))
		}
	}
	switch stage.Action {
	case capstanv1.StageActionApply, "":
		cs, observed, err := e.apply(ctx, stage.Objects, stage.Name, owner, dry)
		res.ChangeSet, res.observed = cs, observed
		if err != nil {
			return failed(res, err)
		}
		if stage.BootstrapKey != nil {
			if err := e.copyBootstrapKey(ctx, stage, owner); err != nil {
				return failed(res, err)
			}
		}
		res.Applied = true
	case capstanv1.StageActionWait, capstanv1.StageActionRollout:
	case capstanv1.StageActionValidate:
		return e.validateStage(ctx, stage, owner)
	case capstanv1.StageActionScale:
		return e.scaleStage(ctx, stage, owner)
	case capstanv1.StageActionDelete:
		return e.deleteStage(ctx, stage, owner)
	case capstanv1.StageActionPivot:
		return e.pivotStage(ctx, stage, owner)
	default:
		return failed(res, Stalled(fmt.Errorf("stage %s: action %q is not supported yet", stage.Name, stage.Action)))
	}
	return res
}

// WaitStage waits until the stage is done or ctx ends (then the result is
// StageInProgress and says what it waits for). For most actions that
// means the stage's readiness checks hold for its objects; a validate
// stage is done once ApplyStage passed; a delete stage waits until its
// objects are gone; a rollout stage advances the rollout while it waits.
func (e *Executor) WaitStage(ctx context.Context, stage *Stage, owner Owner) Result {
	if stage.Action != capstanv1.StageActionValidate {
		if res, down := e.checkAvailable(ctx, stage); down {
			return res
		}
	}
	return e.unreachableAsWaiting(e.waitStage(ctx, stage, owner))
}

func (e *Executor) waitStage(ctx context.Context, stage *Stage, owner Owner) Result {
	switch stage.Action {
	case capstanv1.StageActionValidate:
		// Done in ApplyStage, or failed there.
		return Result{Stage: stage.Name, State: capstanv1.StageReady}
	case capstanv1.StageActionPivot:
		return e.pivotWait(ctx, stage, owner)
	case capstanv1.StageActionRollout:
		if err := e.checkFence(ctx, owner); err != nil {
			return failed(Result{Stage: stage.Name}, fmt.Errorf("stage %s: %w", stage.Name, err))
		}
		return e.rolloutStage(ctx, stage, owner)
	case capstanv1.StageActionDelete:
		return e.waitDeleted(ctx, stage, owner)
	}
	res := Result{Stage: stage.Name}
	checker, err := NewChecker(stage.ReadyWhen)
	if err != nil {
		return failed(res, Stalled(fmt.Errorf("stage %s: %w", stage.Name, err)))
	}
	verdict, err := e.Wait(ctx, stage.Objects, checker, owner)
	if err != nil {
		return failed(res, err)
	}
	res.Message, res.Progress = verdict.Message, objectsReady(verdict.ReadyObjects, len(stage.Objects))
	if verdict.Replicas != nil && !verdict.Ready {
		res.Progress = verdict.Replicas
	}
	if verdict.Ready {
		res.State = capstanv1.StageReady
	} else {
		res.State = capstanv1.StageInProgress
	}
	return res
}

// writes reports whether a stage of this action writes to its cluster in
// ApplyStage: those check the deployment's fencing record first. A pivot
// checks it itself, and a rollout before each attempt of WaitStage.
func writes(a capstanv1.StageAction) bool {
	switch a {
	case capstanv1.StageActionApply, "", capstanv1.StageActionScale, capstanv1.StageActionDelete:
		return true
	}
	return false
}

func failed(res Result, err error) Result {
	res.State = capstanv1.StageFailed
	res.Err = err
	res.Message = err.Error()
	return res
}

// eachOf calls fn for every index of idx from a pool of e.concurrency
// workers and returns when all calls have.
func (e *Executor) eachOf(idx []int, fn func(int)) {
	var g errgroup.Group
	g.SetLimit(e.concurrency)
	for _, i := range idx {
		g.Go(func() error {
			fn(i)
			return nil
		})
	}
	_ = g.Wait()
}

// each calls fn for every object from a pool of e.concurrency workers and
// returns when all calls have.
func (e *Executor) each(objects []*unstructured.Unstructured, fn func(int, *unstructured.Unstructured)) {
	var g errgroup.Group
	g.SetLimit(e.concurrency)
	for i, obj := range objects {
		g.Go(func() error {
			fn(i, obj)
			return nil
		})
	}
	_ = g.Wait()
}

func splitDefinitions(objects []*unstructured.Unstructured) (first, rest []*unstructured.Unstructured) {
	for _, obj := range objects {
		if isDefinition(obj) {
			first = append(first, obj)
		} else {
			rest = append(rest, obj)
		}
	}
	return first, rest
}

func isDefinition(obj *unstructured.Unstructured) bool {
	gvk := obj.GroupVersionKind()
	return (gvk.Group == "" && gvk.Kind == "Namespace") ||
		(gvk.Group == "apiextensions.k8s.io" && gvk.Kind == "CustomResourceDefinition")
}

func hasCRD(objects []*unstructured.Unstructured) bool {
	return slices.ContainsFunc(objects, isCRD)
}

func isCRD(obj *unstructured.Unstructured) bool {
	gvk := obj.GroupVersionKind()
	return gvk.Group == "apiextensions.k8s.io" && gvk.Kind == "CustomResourceDefinition"
}

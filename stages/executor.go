package stages

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fluxcd/cli-utils/pkg/object"
	"github.com/fluxcd/pkg/ssa"
	ssautils "github.com/fluxcd/pkg/ssa/utils"
	"golang.org/x/sync/errgroup"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	e := &Executor{home: c, concurrency: 16}
	e.bind(LocalCluster(c))
	for _, o := range opts {
		o(e)
	}
	return e
}

// On returns an executor with e's settings that applies, waits and
// validates on cluster c. It is cheap: the reconciler calls it per stage.
func (e *Executor) On(c Cluster) *Executor {
	on := *e
	on.bind(c)
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

// Cluster is the cluster the executor acts on.
func (e *Executor) Cluster() Cluster { return e.cluster }

func (e *Executor) bind(c Cluster) {
	e.cluster = c
	e.client = c.Client()
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
	var applied Result
	if !opts.SkipApply {
		applied = e.ApplyStage(ctx, stage, owner)
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
		if obj == nil || !checker.Evaluate(obj).Ready {
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
	if res, down := e.checkAvailable(ctx, stage); down {
		return res
	}
	return e.unreachableAsWaiting(e.applyStage(ctx, stage, owner))
}

func (e *Executor) applyStage(ctx context.Context, stage *Stage, owner Owner) Result {
	res := Result{Stage: stage.Name, State: capstanv1.StageInProgress}
	if writes(stage.Action) {
		if err := e.checkFence(ctx, owner); err != nil {
			return failed(res, fmt.Errorf("stage %s: %w", stage.Name, err))
		}
	}
	switch stage.Action {
	case capstanv1.StageActionApply, "":
		cs, observed, err := e.apply(ctx, stage.Objects, stage.Name, owner)
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

// Apply server-side applies objects from a pool of workers. Cluster-wide
// definitions (CRDs, Namespaces) go first, so that the objects that need
// them can be applied in the same stage. Every object is dry-run before any
// is applied, so an invalid object leaves the wave untouched, and every
// object's error is reported.
func (e *Executor) Apply(ctx context.Context, objects []*unstructured.Unstructured, stage string, owner Owner) (*ssa.ChangeSet, error) {
	cs, _, err := e.apply(ctx, objects, stage, owner)
	return cs, err
}

// apply is Apply that also returns the objects as the API server answered
// (see Result.observed), nil unless every object was applied.
func (e *Executor) apply(ctx context.Context, objects []*unstructured.Unstructured, stage string, owner Owner) (*ssa.ChangeSet, []*unstructured.Unstructured, error) {
	prepared := make([]*unstructured.Unstructured, len(objects))
	for i, obj := range objects {
		prepared[i] = ownedBy(obj, stage, owner)
	}
	first, rest := splitDefinitions(prepared)
	cs := ssa.NewChangeSet()
	var observed []*unstructured.Unstructured
	stale := false
	for _, wave := range [][]*unstructured.Unstructured{first, rest} {
		if len(wave) == 0 {
			continue
		}
		entries, answers, err := e.applyWave(ctx, wave, owner)
		cs.Append(entries)
		if err != nil {
			return cs, nil, err
		}
		observed = append(observed, answers...)
		if hasCRD(wave) {
			// Wait for the CRDs to be Established before objects of their kinds are applied.
			if err := e.waitEstablished(ctx, wave, owner); err != nil {
				return cs, nil, err
			}
			// The answers predate the wait; the stage's wait looks again.
			stale = true
		}
	}
	if stale {
		return cs, nil, nil
	}
	return cs, observed, nil
}

// ownedBy returns a copy of obj labelled with its deployment and stage.
func ownedBy(obj *unstructured.Unstructured, stage string, owner Owner) *unstructured.Unstructured {
	obj = obj.DeepCopy()
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[OwnerNameLabel] = owner.Name
	labels[OwnerNamespaceLabel] = owner.Namespace
	labels[StageKey] = stage
	obj.SetLabels(labels)
	return obj
}

// Reapply applies one object of a stage again, at once: the correction of
// drift, for an object the stage applied before. One request, after the
// fencing check.
func (e *Executor) Reapply(ctx context.Context, obj *unstructured.Unstructured, stage string, owner Owner) error {
	if err := e.checkFence(ctx, owner); err != nil {
		return fmt.Errorf("apply %s again: %w", ObjectRef(obj), err)
	}
	applied := ownedBy(obj, stage, owner)
	if err := e.client.Patch(ctx, applied, client.Apply, client.ForceOwnership, client.FieldOwner(FieldManager)); err != nil {
		return classifyApplyError(obj, err)
	}
	return nil
}

// crdEstablishTimeout bounds the wait for a stage's CRDs when ctx allows
// longer: the API server establishes a CRD within seconds, and one whose
// names it refuses never, while the apply may run without a deadline.
var crdEstablishTimeout = time.Minute

// waitEstablished waits until the definitions just applied are ready (CRDs
// Established, Namespaces Active). Not ready in time is an error that says
// what is awaited: the objects that need them must not be applied yet.
func (e *Executor) waitEstablished(ctx context.Context, definitions []*unstructured.Unstructured, owner Owner) error {
	ctx, cancel := context.WithTimeout(ctx, crdEstablishTimeout)
	defer cancel()
	checker, err := NewChecker(nil)
	if err != nil {
		return fmt.Errorf("wait for CustomResourceDefinitions: %w", err)
	}
	verdict, err := e.waitUntilReady(ctx, definitions, checker, owner)
	if err != nil {
		return fmt.Errorf("wait for CustomResourceDefinitions: %w", err)
	}
	if !verdict.Ready {
		return fmt.Errorf("wait for CustomResourceDefinitions: %s", verdict.Message)
	}
	return e.waitServed(ctx, definitions)
}

// waitServed waits until the client can map every kind the CRDs define.
// Established does not mean that discovery lists the kind yet, and an
// object applied before it does fails as if its CRD were missing. Discovery
// cannot be watched, so this polls, briefly.
func (e *Executor) waitServed(ctx context.Context, definitions []*unstructured.Unstructured) error {
	for _, crd := range definitions {
		if !isCRD(crd) {
			continue
		}
		group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
		kind, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
		versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
		for _, v := range versions {
			version, _ := v.(map[string]any)
			name, _ := version["name"].(string)
			if served, _ := version["served"].(bool); !served {
				continue
			}
			gk := schema.GroupKind{Group: group, Kind: kind}
			for delay := 50 * time.Millisecond; ; delay = min(delay*2, time.Second) {
				_, err := e.client.RESTMapper().RESTMapping(gk, name)
				if err == nil {
					break
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("wait for %s to be served: %w", gk.WithVersion(name), err)
				case <-time.After(delay):
				}
			}
		}
	}
	return nil
}

// applyWave applies a wave of objects all or nothing, in as few requests
// as the API server allows:
//
//  1. look: the live objects, one LIST per kind and namespace that holds
//     many of the wave's objects (a GET each for the others);
//  2. every object that exists is checked (is it another deployment's?)
//     and dry-run (is it valid, would the apply change it?);
//  3. only if all of that passed, the new objects are applied; should one
//     of them be refused (invalid), the ones this wave created are deleted
//     again, so that the wave leaves nothing behind;
//  4. then the existing objects that change are applied.
//
// A new object costs its apply, an unchanged one its dry run, a changed
// one both: every object is validated by the server before anything that
// existed is touched.
func (e *Executor) applyWave(ctx context.Context, objects []*unstructured.Unstructured, owner Owner) ([]ssa.ChangeSetEntry, []*unstructured.Unstructured, error) {
	live, err := e.look(ctx, objects)
	if err != nil {
		return nil, nil, err
	}
	entries := make([]ssa.ChangeSetEntry, len(objects))
	errs := make([]error, len(objects))
	// observed holds each object as the server answered its apply or dry
	// run: what the stage's readiness is decided on first.
	observed := make([]*unstructured.Unstructured, len(objects))
	owners := &ownerLookup{home: e.home}
	var fresh, existing []int
	for i, obj := range objects {
		entries[i] = changeSetEntry(obj)
		if live[i] == nil {
			fresh = append(fresh, i)
			entries[i].Action = ssa.CreatedAction
		} else {
			existing = append(existing, i)
		}
	}
	e.eachOf(existing, func(i int) {
		entries[i].Action, observed[i], errs[i] = e.diffLive(ctx, objects[i], live[i], owner, owners)
	})
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}

	e.eachOf(fresh, func(i int) {
		observed[i], entries[i].Action, errs[i] = e.create(ctx, objects[i], owner, owners)
	})
	if err := errors.Join(errs...); err != nil {
		if IsStalled(err) {
			// The source must change before this wave can pass: take back
			// what it created, so that nothing of it stays half applied.
			var created []*unstructured.Unstructured
			for _, i := range fresh {
				if entries[i].Action == ssa.CreatedAction && observed[i] != nil {
					created = append(created, observed[i])
				}
			}
			return nil, nil, errors.Join(err, e.rollback(ctx, created))
		}
		return appliedEntries(entries, errs, fresh), nil, err
	}

	e.eachOf(existing, func(i int) {
		if entries[i].Action != ssa.ConfiguredAction {
			return
		}
		applied := objects[i].DeepCopy()
		if err := e.client.Patch(ctx, applied, client.Apply, client.ForceOwnership, client.FieldOwner(FieldManager)); err != nil {
			errs[i] = classifyApplyError(objects[i], err)
			return
		}
		observed[i] = applied
	})
	if err := errors.Join(errs...); err != nil {
		return appliedEntries(entries, errs, nil), nil, err
	}
	return appliedEntries(entries, errs, nil), observed, nil
}

// appliedEntries keeps the entries of the objects whose apply did not fail
// (an object whose apply failed was not created or configured), of only
// the objects at the indices of only, when it is not nil.
func appliedEntries(entries []ssa.ChangeSetEntry, errs []error, only []int) []ssa.ChangeSetEntry {
	kept := make([]ssa.ChangeSetEntry, 0, len(entries))
	keep := func(i int) {
		if errs[i] == nil && entries[i].Action != "" {
			kept = append(kept, entries[i])
		}
	}
	if only != nil {
		for _, i := range only {
			keep(i)
		}
		return kept
	}
	for i := range entries {
		keep(i)
	}
	return kept
}

func changeSetEntry(obj *unstructured.Unstructured) ssa.ChangeSetEntry {
	return ssa.ChangeSetEntry{
		ObjMetadata:  object.UnstructuredToObjMetadata(obj),
		GroupVersion: obj.GroupVersionKind().Version,
		Subject:      ssautils.FmtUnstructured(obj),
	}
}

// lookListMin is how many objects of one kind in one namespace a wave
// needs before their live state is read with a LIST rather than a GET
// each.
const lookListMin = 8

// lookPageSize bounds a LIST page of the look, and so the memory it holds
// at once: objects of the kind that the wave does not declare are dropped
// page by page.
const lookPageSize = 500

// lookListShare bounds what a LIST may read for a group: when the kind's
// objects in the namespace outnumber the group's this many times (a fleet
// of deployments in one namespace), the rest of the group is read with a
// GET each instead.
const lookListShare = 4

// look returns the live object of each of objects, nil where there is none.
func (e *Executor) look(ctx context.Context, objects []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	live := make([]*unstructured.Unstructured, len(objects))
	groups := map[groupKey][]int{}
	var keys []groupKey
	for i, obj := range objects {
		k := groupKey{gvk: obj.GroupVersionKind(), namespace: obj.GetNamespace()}
		if groups[k] == nil {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], i)
	}
	// Small groups are read a GET each, together; the others a LIST each.
	var (
		mu   sync.Mutex
		errs []error
		g    errgroup.Group
	)
	each := map[string]int{}
	for _, k := range keys {
		idx := groups[k]
		if len(idx) < lookListMin {
			for _, i := range idx {
				each[ObjectRef(objects[i])] = i
			}
			continue
		}
		g.Go(func() error {
			if err := e.lookList(ctx, k, idx, objects, live); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			return nil
		})
	}
	err := e.lookRest(ctx, each, objects, live)
	_ = g.Wait()
	return live, errors.Join(append(errs, err)...)
}

// lookList reads the live objects of one group (the objects at idx) with a
// paged LIST of their kind in their namespace. The first page holds a few
// times the group; when the kind has many more objects there than that,
// the objects not seen on it are read with a GET each (lookRest), so that
// a stage among thousands of other objects does not read them all.
func (e *Executor) lookList(ctx context.Context, k groupKey, idx []int, objects, live []*unstructured.Unstructured) error {
	want := make(map[string]int, len(idx))
	for _, i := range idx {
		want[objects[i].GetName()] = i
	}
	opts := []client.ListOption{client.Limit(int64(min(lookListShare*len(idx), lookPageSize)))}
	if k.namespace != "" {
		opts = append(opts, client.InNamespace(k.namespace))
	}
	for cont := ""; ; {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(k.gvk.GroupVersion().WithKind(k.gvk.Kind + "List"))
		if err := e.client.List(ctx, list, append(opts, client.Continue(cont))...); err != nil {
			return classifyApplyError(objects[idx[0]], err)
		}
		for j := range list.Items {
			if i, ok := want[list.Items[j].GetName()]; ok {
				live[i] = &list.Items[j]
				delete(want, list.Items[j].GetName())
			}
		}
		if cont = list.GetContinue(); cont == "" || len(want) == 0 {
			return nil
		}
		if remaining := list.GetRemainingItemCount(); remaining == nil || *remaining > int64(lookListShare*len(idx)) {
			return e.lookRest(ctx, want, objects, live)
		}
		opts[0] = client.Limit(lookPageSize)
	}
}

// lookRest reads the objects at the indices of want (its values) with a
// GET each.
func (e *Executor) lookRest(ctx context.Context, want map[string]int, objects, live []*unstructured.Unstructured) error {
	var (
		mu   sync.Mutex
		errs []error
	)
	var g errgroup.Group
	g.SetLimit(e.concurrency)
	for _, i := range want {
		g.Go(func() error {
			obj := &unstructured.Unstructured{}
			obj.SetGroupVersionKind(objects[i].GroupVersionKind())
			err := e.client.Get(ctx, client.ObjectKeyFromObject(objects[i]), obj)
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				mu.Lock()
				errs = append(errs, classifyApplyError(objects[i], err))
				mu.Unlock()
			default:
				live[i] = obj
			}
			return nil
		})
	}
	_ = g.Wait()
	return errors.Join(errs...)
}

// diffLive decides for an object that exists (live) whether owner may
// apply it (checkOwner) and whether the apply changes it, by a server-side
// dry run, which also validates it.
//
// It returns the dry run's answer, which is the object as it is when the
// apply changes nothing.
func (e *Executor) diffLive(ctx context.Context, obj, live *unstructured.Unstructured, owner Owner, owners *ownerLookup) (ssa.Action, *unstructured.Unstructured, error) {
	if err := owners.check(ctx, obj, live, owner); err != nil {
		return "", nil, err
	}
	dryRun := obj.DeepCopy()
	if err := e.client.Patch(ctx, dryRun, client.Apply, client.DryRunAll, client.ForceOwnership, client.FieldOwner(FieldManager)); err != nil {
		return "", nil, classifyApplyError(obj, err)
	}
	if changes(live, dryRun, true) {
		return ssa.ConfiguredAction, nil, nil
	}
	return ssa.UnchangedAction, dryRun, nil
}

// create applies an object the look found absent. It applies without
// force: should the object have been created meanwhile by someone else,
// with other values, the apply conflicts instead of taking it over, and
// the object goes the way of one that existed (diff, then apply). It
// returns the object as the last apply answered and the action taken:
// CreatedAction only for an object this apply created.
func (e *Executor) create(ctx context.Context, obj *unstructured.Unstructured, owner Owner, owners *ownerLookup) (*unstructured.Unstructured, ssa.Action, error) {
	applied := obj.DeepCopy()
	err := e.client.Patch(ctx, applied, client.Apply, client.FieldOwner(FieldManager))
	if err == nil {
		if len(applied.GetManagedFields()) > 1 {
			// Someone else wrote it meanwhile, with the same values: the
			// apply shared their fields. Look at it as at one that existed.
			return applied, ssa.UnchangedAction, e.lateCheck(ctx, obj, applied, owner, owners)
		}
		return applied, ssa.CreatedAction, nil
	}
	if !apierrors.IsConflict(err) {
		return nil, "", classifyApplyError(obj, err)
	}
	entry, err := e.diff(ctx, obj, owner, owners)
	if err != nil || (entry.Action != ssa.CreatedAction && entry.Action != ssa.ConfiguredAction) {
		return nil, entry.Action, err
	}
	applied = obj.DeepCopy()
	if err := e.client.Patch(ctx, applied, client.Apply, client.ForceOwnership, client.FieldOwner(FieldManager)); err != nil {
		return nil, "", classifyApplyError(obj, err)
	}
	return applied, entry.Action, nil
}

// lateCheck runs the ownership check on an object that appeared between
// the look and the apply. The apply changed none of its data (it would
// have conflicted otherwise), only Capstan's labels; a refusal is
// reported like any other.
func (e *Executor) lateCheck(ctx context.Context, obj, applied *unstructured.Unstructured, owner Owner, owners *ownerLookup) error {
	before := applied.DeepCopy()
	labels := before.GetLabels()
	delete(labels, OwnerNameLabel)
	delete(labels, OwnerNamespaceLabel)
	delete(labels, StageKey)
	before.SetLabels(labels)
	return owners.check(ctx, obj, before, owner)
}

// rollback deletes the objects a failed wave created, each only if it is
// still the object created (its UID).
func (e *Executor) rollback(ctx context.Context, created []*unstructured.Unstructured) error {
	var mu sync.Mutex
	var errs []error
	var g errgroup.Group
	g.SetLimit(e.concurrency)
	for _, obj := range created {
		g.Go(func() error {
			uid := obj.GetUID()
			err := e.client.Delete(ctx, obj, client.Preconditions{UID: &uid}, client.PropagationPolicy(metav1.DeletePropagationBackground))
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				mu.Lock()
				errs = append(errs, fmt.Errorf("remove %s, created by this failed attempt: %w", ObjectRef(obj), err))
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait()
	return errors.Join(errs...)
}

// diff looks at what applying obj would do: a server-side dry-run first
// (which also validates it), then, only for an object that exists, a GET
// of the live object, which decides whether owner may apply it
// (checkOwner) and whether the apply changes it. A new object costs one
// request here.
func (e *Executor) diff(ctx context.Context, obj *unstructured.Unstructured, owner Owner, owners *ownerLookup) (ssa.ChangeSetEntry, error) {
	entry := changeSetEntry(obj)
	dryRun := obj.DeepCopy()
	if err := e.client.Patch(ctx, dryRun, client.Apply, client.DryRunAll, client.ForceOwnership, client.FieldOwner(FieldManager)); err != nil {
		return entry, classifyApplyError(obj, err)
	}
	if dryRun.GetResourceVersion() == "" {
		entry.Action = ssa.CreatedAction
		return entry, nil
	}
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(obj.GroupVersionKind())
	if err := e.client.Get(ctx, client.ObjectKeyFromObject(obj), live); err != nil {
		if apierrors.IsNotFound(err) {
			// Deleted since the dry run: the apply creates it.
			entry.Action = ssa.CreatedAction
			return entry, nil
		}
		return entry, classifyApplyError(obj, err)
	}
	if err := owners.check(ctx, obj, live, owner); err != nil {
		return entry, err
	}
	if changes(live, dryRun, true) {
		entry.Action = ssa.ConfiguredAction
	} else {
		entry.Action = ssa.UnchangedAction
	}
	return entry, nil
}

// changes reports whether dryRun, the result of applying to live, differs
// from it: in labels, annotations (withMeta) or anything but metadata and
// status.
func changes(live, dryRun *unstructured.Unstructured, withMeta bool) bool {
	if withMeta && (!apiequality.Semantic.DeepEqual(live.GetLabels(), dryRun.GetLabels()) ||
		!apiequality.Semantic.DeepEqual(live.GetAnnotations(), dryRun.GetAnnotations())) {
		return true
	}
	strip := func(u *unstructured.Unstructured) map[string]any {
		c := make(map[string]any, len(u.Object))
		for k, v := range u.Object {
			if k != "metadata" && k != "status" {
				c[k] = v
			}
		}
		return c
	}
	return !apiequality.Semantic.DeepEqual(strip(live), strip(dryRun))
}

// ownerLookup remembers, for one wave, which ClusterDeployments named in
// objects' owner labels still exist.
type ownerLookup struct {
	home client.Client
	mu   sync.Mutex
	seen map[Owner]bool
}

// exists reports whether the ClusterDeployment o exists in the cluster
// Capstan runs in.
func (l *ownerLookup) exists(ctx context.Context, o Owner) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ok, found := l.seen[o]; found {
		return ok, nil
	}
	cd := &metav1.PartialObjectMetadata{}
	cd.SetGroupVersionKind(capstanv1.GroupVersion.WithKind("ClusterDeployment"))
	err := l.home.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.Name}, cd)
	if meta.IsNoMatchError(err) {
		err = apierrors.NewNotFound(schema.GroupResource{Group: capstanv1.GroupVersion.Group, Resource: "clusterdeployments"}, o.Name)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("look up ClusterDeployment %s/%s: %w", o.Namespace, o.Name, err)
	}
	if l.seen == nil {
		l.seen = map[Owner]bool{}
	}
	l.seen[o] = err == nil
	return err == nil, nil
}

// check decides whether owner may apply obj over live, the object of that
// name in the cluster. An object another existing deployment applied is a
// conflict. One that no deployment applied (or whose deployment is gone)
// is adopted when the source says so (capstan.dev/adopt: "true") or when
// applying changes none of its data; a Secret only when the source says so.
func (l *ownerLookup) check(ctx context.Context, obj, live *unstructured.Unstructured, owner Owner) error {
	labels := live.GetLabels()
	current := Owner{Name: labels[OwnerNameLabel], Namespace: labels[OwnerNamespaceLabel]}
	if current == owner {
		return nil
	}
	if current.Name != "" {
		ok, err := l.exists(ctx, current)
		if err != nil {
			return err
		}
		if ok {
			return Stalled(fmt.Errorf("%s belongs to ClusterDeployment %s/%s, and %s/%s declares it too: "+
				"remove it from the source of one of them (an object has one owner; nothing of this stage was applied)",
				ObjectRef(obj), current.Namespace, current.Name, owner.Namespace, owner.Name))
		}
		// Left behind by a deployment deleted with deletionPolicy Orphan.
		return nil
	}
	if obj.GetAnnotations()[AdoptAnnotation] == "true" {
		return nil
	}
	if obj.GetKind() == "Secret" && obj.GroupVersionKind().Group == "" {
		return Stalled(fmt.Errorf("%s exists and was not applied by Capstan; a Secret is taken over only when the source annotates it %s: \"true\"",
			ObjectRef(obj), AdoptAnnotation))
	}
	if changes(live, withoutMeta(obj, live), false) {
		return Stalled(fmt.Errorf("%s exists, was not applied by Capstan and differs from the source; "+
			"to take it over, annotate it in the source with %s: \"true\"", ObjectRef(obj), AdoptAnnotation))
	}
	return nil
}

// withoutMeta returns what applying obj declares of live's data: obj's
// fields over live's, enough to tell whether obj changes any of them.
func withoutMeta(obj, live *unstructured.Unstructured) *unstructured.Unstructured {
	merged := live.DeepCopy()
	for k, v := range obj.Object {
		if k == "metadata" || k == "status" || k == "apiVersion" || k == "kind" {
			continue
		}
		merged.Object[k] = mergeValue(merged.Object[k], v)
	}
	return merged
}

// mergeValue lays declared over live the way an apply of maps does:
// maps merge key by key, anything else is replaced.
func mergeValue(live, declared any) any {
	lm, ok1 := live.(map[string]any)
	dm, ok2 := declared.(map[string]any)
	if !ok1 || !ok2 {
		return declared
	}
	out := make(map[string]any, len(lm))
	for k, v := range lm {
		out[k] = v
	}
	for k, v := range dm {
		out[k] = mergeValue(lm[k], v)
	}
	return out
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

// classifyApplyError names the object and marks errors a retry cannot fix
// (a kind the cluster does not know, an invalid object) as stalled.
func classifyApplyError(obj *unstructured.Unstructured, err error) error {
	wrapped := err
	if !strings.Contains(err.Error(), ObjectRef(obj)) {
		wrapped = fmt.Errorf("apply %s: %w", ObjectRef(obj), err)
	}
	if meta.IsNoMatchError(err) {
		return Stalled(fmt.Errorf("apply %s: the cluster does not serve %s (is its CustomResourceDefinition installed?): %w",
			ObjectRef(obj), obj.GroupVersionKind().GroupVersion().WithKind(obj.GetKind()), err))
	}
	if isInvalid(err) {
		return Stalled(wrapped)
	}
	if isRBACDenied(err) {
		// Retryable: granting the permission heals the stage at the same
		// revision.
		return fmt.Errorf("%w; grant Capstan's ServiceAccount this permission with a ClusterRole labelled %s: \"true\" (docs/install.md#rbac)", wrapped, AggregateToApplyLabel)
	}
	return wrapped
}

// AggregateToApplyLabel marks the ClusterRoles whose rules the
// capstan-apply ClusterRole aggregates: the kinds Capstan may apply.
const AggregateToApplyLabel = "capstan.dev/aggregate-to-apply"

// isRBACDenied reports a request the authorizer refused ("User ... cannot
// patch resource ..."), as opposed to a Forbidden from admission.
func isRBACDenied(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), " cannot ")
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

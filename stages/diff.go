package stages

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/fluxcd/cli-utils/pkg/object"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
)

// DiffAction is what applying a revision would do to one object.
type DiffAction string

// What a revision would do to an object.
const (
	// DiffCreate: the object does not exist; the apply creates it.
	DiffCreate DiffAction = "create"
	// DiffChange: the apply changes the live object (Fields say how).
	DiffChange DiffAction = "change"
	// DiffUnchanged: the apply leaves the live object as it is.
	DiffUnchanged DiffAction = "unchanged"
	// DiffDelete: the object goes, by a prune or a delete stage.
	DiffDelete DiffAction = "delete"
	// DiffHeld: the revision drops an object of a destructive kind, which
	// is kept until the deployment sets spec.prune.destructive.
	DiffHeld DiffAction = "held"
	// DiffKept: the revision drops an object marked capstan.dev/prune:
	// disabled; it stays in the cluster.
	DiffKept DiffAction = "kept"
	// DiffConflict: another ClusterDeployment owns the object, or it
	// exists unowned and may not be taken over; the stage would fail.
	DiffConflict DiffAction = "conflict"
	// DiffInvalid: the API server refuses the object (dry-run Invalid, a
	// kind it does not serve); the stage would fail.
	DiffInvalid DiffAction = "invalid"
	// DiffFailed: the object could not be looked at (e.g. RBAC denied).
	DiffFailed DiffAction = "failed"
	// DiffNotCompared: the object acts on a cluster the diff could not
	// compare with (it does not exist yet, or does not answer); its
	// stage's NotCompared says why.
	DiffNotCompared DiffAction = "not-compared"
)

// ObjectDiff is what a revision would do to one object.
type ObjectDiff struct {
	// Ref names the object as Kind/namespace/name.
	Ref        string     `json:"ref"`
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Namespace  string     `json:"namespace,omitempty"`
	Name       string     `json:"name"`
	Action     DiffAction `json:"action"`
	// Stage is the inventory stage of a pruned object.
	Stage string `json:"stage,omitempty"`
	// Fields are the fields a change changes, in path order.
	Fields []FieldDiff `json:"fields,omitempty"`
	// Note says why: the reason an object is held or kept, or that a
	// create could not be validated yet.
	Note string `json:"note,omitempty"`
	// Error is the problem of a conflict, an invalid object or a failed
	// look, with File and Field when they are known.
	Error string `json:"error,omitempty"`
	File  string `json:"file,omitempty"`
	Field string `json:"field,omitempty"`
}

// Problem reports whether the object would stop its stage.
func (o ObjectDiff) Problem() bool {
	return o.Action == DiffConflict || o.Action == DiffInvalid || o.Action == DiffFailed
}

// StageDiff is what a revision would do in one stage.
type StageDiff struct {
	Name   string                `json:"name"`
	Action capstanv1.StageAction `json:"action"`
	// Objects are the stage's objects: applied by an apply stage, deleted
	// by a delete stage. Other stages act on objects of other stages.
	Objects []ObjectDiff `json:"objects,omitempty"`
	// Works is true when the stage would change something: apply or
	// delete objects, hand LCM machines new items.
	Works bool `json:"works"`
	// Runs is true when the stage would be walked again: it works, or the
	// revision is new (a new revision starts every stage from Pending; a
	// stage with nothing to do passes once its checks hold).
	Runs bool `json:"runs"`
	// Why says what the stage would do, in a few words.
	Why string `json:"why,omitempty"`
	// Rollouts are the machine rollouts the stage's changes start.
	Rollouts []RolloutDiff `json:"rollouts,omitempty"`
	// Cluster names the cluster the stage acts on when it is not the
	// one the diff runs against: the kubeconfig Secret that reaches it.
	Cluster string `json:"cluster,omitempty"`
	// NotCompared says why the stage's objects were not compared with
	// its cluster; empty when they were.
	NotCompared string `json:"notCompared,omitempty"`
}

// PlanDiff is what applying a plan would do to a live cluster: per stage
// and object a server-side dry-run against the live object, the objects
// the revision drops, and the rollouts that follow. It is data: the CLI
// prints it, the reconciler turns it into a pull-request comment.
type PlanDiff struct {
	Owner Owner `json:"owner"`
	// NewRevision is true when the plan is of a revision the deployment
	// has not applied yet.
	NewRevision bool        `json:"newRevision"`
	Stages      []StageDiff `json:"stages"`
	// Prune are the objects of the inventory that the revision drops,
	// deleted once every stage is Ready, in reverse stage order.
	Prune []ObjectDiff `json:"prune,omitempty"`
	// Unanswered is true when a stage (or a prune) was not compared
	// because its cluster did not answer: worth asking again later,
	// unlike a cluster whose kubeconfig does not exist yet.
	Unanswered bool `json:"unanswered,omitempty"`
	// secrets holds the values of the Secrets the diff saw (rendered and
	// live), so that whatever prints it can check its text for them. Never
	// serialized.
	secrets []map[string][]byte
}

// DiffCounts counts the objects of a PlanDiff by action.
type DiffCounts struct {
	Create, Change, Unchanged, Delete, Held, Kept, Problems int
	// NotCompared counts the objects of clusters the diff could not
	// compare with.
	NotCompared int
}

// Counts counts the diff's objects by action.
func (d *PlanDiff) Counts() DiffCounts {
	var c DiffCounts
	count := func(o ObjectDiff) {
		switch o.Action {
		case DiffCreate:
			c.Create++
		case DiffChange:
			c.Change++
		case DiffUnchanged:
			c.Unchanged++
		case DiffDelete:
			c.Delete++
		case DiffHeld:
			c.Held++
		case DiffKept:
			c.Kept++
		case DiffNotCompared:
			c.NotCompared++
		default:
			c.Problems++
		}
	}
	for _, s := range d.Stages {
		for _, o := range s.Objects {
			count(o)
		}
	}
	for _, o := range d.Prune {
		count(o)
	}
	return c
}

// Changes reports whether applying the plan would change the cluster, or
// fail: what `capstan diff` exits 1 for. Objects not compared count: a
// diff that could not look cannot say nothing changes.
func (d *PlanDiff) Changes() bool {
	c := d.Counts()
	return c.Create+c.Change+c.Delete+c.Problems+c.NotCompared > 0 || len(d.Rollouts()) > 0
}

// Problems lists the objects that would stop their stage, in plan order.
func (d *PlanDiff) Problems() []ObjectDiff {
	var out []ObjectDiff
	for _, s := range d.Stages {
		for _, o := range s.Objects {
			if o.Problem() {
				out = append(out, o)
			}
		}
	}
	for _, o := range d.Prune {
		if o.Problem() {
			out = append(out, o)
		}
	}
	return out
}

// Rollouts lists every stage's rollouts, in plan order.
func (d *PlanDiff) Rollouts() []RolloutDiff {
	var out []RolloutDiff
	for _, s := range d.Stages {
		out = append(out, s.Rollouts...)
	}
	return out
}

// SecretData returns the data of every Secret the diff saw, rendered or
// live, for a last check that no value reached the printed text. The diff
// itself never holds a Secret value in any exported field.
func (d *PlanDiff) SecretData() []map[string][]byte { return d.secrets }

// DiffOptions tune DiffPlan.
type DiffOptions struct {
	// Inventory is the deployment's status.inventory: what it applied.
	// The objects it holds and the plan drops are pruned.
	Inventory *capstanv1.Inventory
	// Destructive is the deployment's spec.prune.destructive.
	Destructive bool
	// NewRevision says that the plan is of a revision the deployment has
	// not applied yet: every stage is walked again.
	NewRevision bool
}

// DiffPlan works out what applying plan for owner would do to the
// executor's cluster, without changing it: for every object of an apply
// stage the server-side dry-run apply the executor would send (field
// manager capstan, forced, with the owner labels) and a GET of the live
// object; the objects a delete stage would delete; the objects the
// inventory holds that the plan drops; and the rollouts the changes start.
// Problems of single objects (invalid, not served, owned by another
// deployment) are collected in the result, all of them; the error is for
// what stops the whole look (the cluster cannot be reached).
func (e *Executor) DiffPlan(ctx context.Context, plan *Plan, owner Owner, opts DiffOptions) (*PlanDiff, error) {
	if e.cluster != nil {
		if err := e.cluster.CheckAvailable(ctx); err != nil {
			return nil, &UnreachableError{Cluster: e.cluster.Name(), Err: err}
		}
	}
	d := &PlanDiff{Owner: owner, NewRevision: opts.NewRevision, Stages: make([]StageDiff, len(plan.Stages))}
	pending := planDefinitions(plan)
	owners := &ownerLookup{home: e.home}
	// dryRuns keeps the dry-run result of every changed or created
	// object, for the rollouts.
	dryRuns := map[string]*unstructured.Unstructured{}
	lives := map[string]*unstructured.Unstructured{}
	// pendingAt are the objects no dry run can reach yet, for the schema
	// check.
	pendingAt := map[*unstructured.Unstructured]*ObjectDiff{}
	for i := range plan.Stages {
		stage := &plan.Stages[i]
		sd := StageDiff{Name: stage.Name, Action: stage.Action}
		switch stage.Action {
		case capstanv1.StageActionApply, "":
			sd.Objects = make([]ObjectDiff, len(stage.Objects))
			looks, err := e.lookAll(ctx, stage, owner, owners, pending)
			if err != nil {
				return nil, err
			}
			for j, l := range looks {
				sd.Objects[j] = l.diff
				if l.pending {
					pendingAt[stage.Objects[j]] = &sd.Objects[j]
				}
				if l.diff.Problem() && l.diff.File == "" {
					sd.Objects[j].File = plan.Files[stage.Objects[j]]
				}
				d.addSecret(stage.Objects[j], l.live)
				id := ObjectID(stage.Objects[j])
				if l.dryRun != nil {
					dryRuns[id] = l.dryRun
				}
				if l.live != nil {
					lives[id] = l.live
				}
			}
		case capstanv1.StageActionDelete:
			for _, obj := range stage.Objects {
				od, err := e.diffDeletion(ctx, obj)
				if err != nil {
					return nil, e.unreachable(ctx, err)
				}
				if od != nil {
					sd.Objects = append(sd.Objects, *od)
				}
			}
		}
		d.Stages[i] = sd
	}
	if err := e.diffSchemas(ctx, plan, owner, pendingAt); err != nil {
		if IsUnanswered(err) {
			return nil, e.unreachable(ctx, err)
		}
		return nil, err
	}
	if err := e.diffPrune(ctx, d, plan, owner, opts); err != nil {
		return nil, e.unreachable(ctx, err)
	}
	if err := e.diffRollouts(ctx, d, plan, dryRuns, lives); err != nil {
		if IsUnanswered(err) {
			return nil, e.unreachable(ctx, err)
		}
		return nil, err
	}
	handed := map[string]int{}
	for _, r := range d.Rollouts() {
		for _, b := range r.Batches {
			handed[b.Stage] += len(b.Machines)
		}
	}
	for i := range d.Stages {
		judgeStage(&d.Stages[i], handed[d.Stages[i].Name], opts.NewRevision)
	}
	d.scrub()
	return d, nil
}

// objectLook is what looking at one object found.
type objectLook struct {
	diff   ObjectDiff
	dryRun *unstructured.Unstructured // the object as the apply would leave it
	live   *unstructured.Unstructured // nil when it does not exist
	err    error                      // only for what stops the whole diff
	// pending is true when no dry run can reach the object yet: an
	// earlier object of the plan creates its namespace or its kind.
	pending bool
}

// lookAll looks at every object of an apply stage, e.concurrency at a
// time. The first object that finds the cluster gone (IsUnanswered) stops
// the others: they would only wait for the same silence, each up to the
// dialer's timeout, and its error is the stage's.
func (e *Executor) lookAll(ctx context.Context, stage *Stage, owner Owner, owners *ownerLookup, pending definitions) ([]objectLook, error) {
	looks := make([]objectLook, len(stage.Objects))
	lookCtx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		once  sync.Once
		first error
	)
	e.each(stage.Objects, func(j int, obj *unstructured.Unstructured) {
		if lookCtx.Err() != nil {
			return
		}
		looks[j] = e.diffObject(lookCtx, obj, stage.Name, owner, owners, pending)
		if looks[j].err != nil {
			once.Do(func() { first = looks[j].err; stop() })
		}
	})
	if first == nil && ctx.Err() != nil {
		// Ended before some object was looked at.
		first = fmt.Errorf("look at the objects of stage %s: %w", stage.Name, ctx.Err())
	}
	if first != nil {
		return nil, e.unreachable(ctx, first)
	}
	return looks, nil
}

// unreachable makes err, which stopped the whole look, the cluster being
// unreachable, unless the caller's context ended: then nothing was learnt
// about the cluster, and err says the context ended.
func (e *Executor) unreachable(ctx context.Context, err error) error {
	if ctx.Err() != nil || IsUnreachable(err) {
		return err
	}
	name := LocalClusterName
	if e.cluster != nil {
		name = e.cluster.Name()
	}
	return &UnreachableError{Cluster: name, Err: err}
}

// diffObject dry-runs the apply of one object and compares the result
// with the live object, the way the executor decides to apply it.
func (e *Executor) diffObject(ctx context.Context, obj *unstructured.Unstructured, stage string, owner Owner, owners *ownerLookup, pending definitions) objectLook {
	od := newObjectDiff(obj)
	applied := ownedBy(obj, stage, owner)
	dryRun := applied.DeepCopy()
	err := e.client.Patch(ctx, dryRun, client.Apply, client.DryRunAll, client.ForceOwnership, client.FieldOwner(FieldManager))
	if err != nil {
		if why := pending.explains(obj, err); why != "" && !IsUnanswered(err) {
			// Served or created only once an earlier object of the
			// plan is applied: a create the server cannot check yet.
			od.Action, od.Note = DiffCreate, why
			return objectLook{diff: od, pending: true}
		}
		return e.lookFailed(od, obj, "dry-run", err)
	}
	if dryRun.GetResourceVersion() == "" {
		od.Action = DiffCreate
		return objectLook{diff: od, dryRun: dryRun}
	}
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(obj.GroupVersionKind())
	if err := e.client.Get(ctx, client.ObjectKeyFromObject(obj), live); err != nil {
		if apierrors.IsNotFound(err) {
			od.Action = DiffCreate
			return objectLook{diff: od, dryRun: dryRun}
		}
		return e.lookFailed(od, obj, "read", err)
	}
	if err := owners.check(ctx, obj, live, owner); err != nil {
		switch {
		case failure.ReasonOf(err, "") == ReasonOwnershipConflict:
			od.Action = DiffConflict
		case IsUnanswered(err):
			// The ClusterDeployments live in the cluster Capstan runs in,
			// which may be another one than the object's.
			return objectLook{err: &UnreachableError{Cluster: LocalClusterName, Err: fmt.Errorf("check the owner of %s: %w", ObjectRef(obj), err)}}
		default:
			od.Action = DiffFailed
		}
		od.Error = err.Error()
		return objectLook{diff: od, live: live}
	}
	od.Fields = FieldDiffs(live, dryRun)
	od.Action = DiffUnchanged
	if changes(live, dryRun, true) {
		od.Action = DiffChange
	}
	return objectLook{diff: od, dryRun: dryRun, live: live}
}

// lookFailed records why an object could not be dry-run or read (verb).
// A cluster that stopped answering (IsUnanswered) stops the whole diff:
// every object after it would fail alike, and a plan of objects that all
// "fail" blames the revision for the cluster.
func (e *Executor) lookFailed(od ObjectDiff, obj *unstructured.Unstructured, verb string, err error) objectLook {
	if IsUnanswered(err) {
		return objectLook{err: fmt.Errorf("%s %s: %w", verb, ObjectRef(obj), err)}
	}
	classified := e.classify(obj, err)
	od.Action, od.Error = DiffFailed, classified.Error()
	// A permission Capstan lacks is not a fault of the object: granting it
	// heals the apply at the same revision, so preflight only warns and the
	// stage itself fails, naming it, and is tried again.
	if IsStalled(classified) && !isRBACDenied(err) {
		od.Action = DiffInvalid
	}
	od.Field = invalidField(err)
	if od.Field == "" {
		// Server-side apply names a field that does not fit the schema
		// only in its message.
		od.Field, _ = typedPatchField(err)
	}
	od.File = originFile(obj)
	return objectLook{diff: od}
}

// invalidField is the field the API server names in its answer, when it
// names exactly one.
func invalidField(err error) string {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return ""
	}
	var fields []string
	for _, c := range status.Status().Details.Causes {
		if c.Field != "" && !slices.Contains(fields, c.Field) {
			fields = append(fields, c.Field)
		}
	}
	if len(fields) == 1 {
		return fields[0]
	}
	return ""
}

func newObjectDiff(obj *unstructured.Unstructured) ObjectDiff {
	return ObjectDiff{
		Ref:        ObjectRef(obj),
		APIVersion: obj.GetAPIVersion(),
		Kind:       obj.GetKind(),
		Namespace:  obj.GetNamespace(),
		Name:       obj.GetName(),
	}
}

// diffDeletion looks at an object a delete stage deletes: nil when it is
// gone already.
func (e *Executor) diffDeletion(ctx context.Context, obj *unstructured.Unstructured) (*ObjectDiff, error) {
	od := newObjectDiff(obj)
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(obj.GroupVersionKind())
	err := e.client.Get(ctx, client.ObjectKeyFromObject(obj), live)
	switch {
	case IsUnanswered(err):
		// Before NoMatch: discovery joins the groups it could not reach
		// with those it found missing.
		return nil, fmt.Errorf("look up %s: %w", ObjectRef(obj), err)
	case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
		return nil, nil
	case err != nil:
		od.Action, od.Error = DiffFailed, fmt.Sprintf("look up %s: %v", ObjectRef(obj), err)
		return &od, nil
	}
	od.Action = DiffDelete
	return &od, nil
}

// diffPrune lists the inventory's objects that the plan drops, with what
// a prune would do to each: the executor's Prune, as a dry run.
func (e *Executor) diffPrune(ctx context.Context, d *PlanDiff, plan *Plan, owner Owner, opts DiffOptions) error {
	for _, stage := range Stale(opts.Inventory, plan) {
		if err := e.diffPruneStage(ctx, d, stage, owner, opts.Destructive); err != nil {
			return err
		}
	}
	return nil
}

// diffPruneStage adds what a prune would do to the entries of one
// inventory stage that the plan drops.
func (e *Executor) diffPruneStage(ctx context.Context, d *PlanDiff, stage capstanv1.InventoryStage, owner Owner, destructive bool) error {
	res, err := e.Prune(ctx, stage.Entries, owner, PruneOptions{Destructive: destructive, DryRun: true})
	if slices.ContainsFunc(unjoin(err), IsUnanswered) {
		return fmt.Errorf("look up what the revision drops: %w", err)
	}
	versions := map[string]string{}
	for _, entry := range stage.Entries {
		versions[entry.ID] = entry.Version
	}
	add := func(ids []string, action DiffAction, note string) {
		for _, id := range ids {
			d.Prune = append(d.Prune, pruneDiff(id, versions[id], stage.Name, action, note))
		}
	}
	add(res.Deleting, DiffDelete, "")
	add(res.Held, DiffHeld, "a destructive kind: kept until the deployment sets spec.prune.destructive")
	add(res.Kept, DiffKept, PruneKey+": disabled: stays in the cluster, leaves the inventory")
	for _, id := range slices.Sorted(maps.Keys(res.Protected)) {
		add([]string{id}, DiffKept, "never deleted, "+res.Protected[id]+": stays in the cluster, leaves the inventory")
	}
	for _, err := range unjoin(err) {
		if err != nil {
			d.Prune = append(d.Prune, ObjectDiff{Ref: "(prune)", Stage: stage.Name, Action: DiffFailed, Error: err.Error()})
		}
	}
	return nil
}

func pruneDiff(id, version, stage string, action DiffAction, note string) ObjectDiff {
	od := ObjectDiff{Ref: EntryRef(id), Stage: stage, Action: action, Note: note}
	if m, err := object.ParseObjMetadata(id); err == nil {
		od.APIVersion = schema.GroupVersion{Group: m.GroupKind.Group, Version: version}.String()
		od.Kind, od.Namespace, od.Name = m.GroupKind.Kind, m.Namespace, m.Name
	}
	return od
}

// judgeStage says whether a stage would run again, and why.
// machines counts the LCM machines the stage would hand new items.
func judgeStage(sd *StageDiff, machines int, newRevision bool) {
	var create, change, remove, problems int
	for _, o := range sd.Objects {
		switch {
		case o.Action == DiffCreate:
			create++
		case o.Action == DiffChange:
			change++
		case o.Action == DiffDelete:
			remove++
		case o.Problem():
			problems++
		}
	}
	var why []string
	for _, part := range []struct {
		n    int
		verb string
	}{{create, "create"}, {change, "change"}, {remove, "delete"}} {
		if part.n > 0 {
			why = append(why, fmt.Sprintf("%s %d", part.verb, part.n))
		}
	}
	switch {
	case machines == 1:
		why = append(why, "hand new items to 1 machine")
	case machines > 1:
		why = append(why, fmt.Sprintf("hand new items to %d machines", machines))
	}
	switch {
	case problems == 1:
		why = append(why, "1 object fails")
	case problems > 1:
		why = append(why, fmt.Sprintf("%d objects fail", problems))
	}
	sd.Works = len(why) > 0
	sd.Runs = sd.Works || newRevision
	switch {
	case sd.Works:
		sd.Why = strings.Join(why, ", ")
	case newRevision:
		sd.Why = "re-checked at the new revision; nothing to do"
	}
}

// addSecret remembers the values of a Secret the diff saw.
func (d *PlanDiff) addSecret(objs ...*unstructured.Unstructured) {
	for _, obj := range objs {
		if obj == nil {
			continue
		}
		if isDecrypted(obj) && !isSecret(obj) {
			d.addDecrypted(obj)
			continue
		}
		if !isSecret(obj) {
			continue
		}
		values := map[string][]byte{}
		if data, ok := obj.Object["data"].(map[string]any); ok {
			for k, v := range data {
				s, _ := v.(string)
				if raw, err := base64.StdEncoding.DecodeString(s); err == nil {
					values[k] = raw
				}
				// The encoded form too: it is what a careless print shows.
				values[k+".base64"] = []byte(s)
			}
		}
		if data, ok := obj.Object["stringData"].(map[string]any); ok {
			for k, v := range data {
				s, _ := v.(string)
				values[k] = []byte(s)
			}
		}
		if len(values) > 0 {
			d.secrets = append(d.secrets, values)
		}
	}
}

func isSecret(obj *unstructured.Unstructured) bool {
	return obj.GetKind() == "Secret" && obj.GroupVersionKind().Group == ""
}

// isDecrypted reports whether render decrypted obj from a sops file
// (capstanv1.DecryptedAnnotation): its values are secret whatever its kind.
func isDecrypted(obj *unstructured.Unstructured) bool {
	return obj != nil && obj.GetAnnotations()[capstanv1.DecryptedAnnotation] == "true"
}

// addDecrypted remembers the string values outside the metadata of a
// decrypted object that is not a Secret, for the scrubber.
func (d *PlanDiff) addDecrypted(obj *unstructured.Unstructured) {
	values := map[string][]byte{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case string:
			values[path] = []byte(v)
		case map[string]any:
			for k, e := range v {
				walk(path+"."+k, e)
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		}
	}
	for k, v := range obj.Object {
		if k != "metadata" && k != "apiVersion" && k != "kind" {
			walk(k, v)
		}
	}
	if len(values) > 0 {
		d.secrets = append(d.secrets, values)
	}
}

// minScrubbed is the shortest Secret value scrubbed from the diff's text:
// shorter ones would garble words and reveal little.
const minScrubbed = 6

// scrub replaces any Secret value that reached a message or a field of
// the diff (an error quoting an object, a ConfigMap holding a copy).
func (d *PlanDiff) scrub() {
	var values []string
	for _, data := range d.secrets {
		for _, v := range data {
			if s := strings.TrimSpace(string(v)); len(s) >= minScrubbed {
				values = append(values, s)
			}
		}
	}
	if len(values) == 0 {
		return
	}
	slices.SortFunc(values, func(a, b string) int { return len(b) - len(a) })
	clean := func(s *string) {
		for _, v := range values {
			if strings.Contains(*s, v) {
				*s = strings.ReplaceAll(*s, v, redacted)
			}
		}
	}
	each := func(o *ObjectDiff) {
		clean(&o.Error)
		clean(&o.Note)
		for i := range o.Fields {
			clean(&o.Fields[i].Old)
			clean(&o.Fields[i].New)
		}
	}
	for i := range d.Stages {
		for j := range d.Stages[i].Objects {
			each(&d.Stages[i].Objects[j])
		}
	}
	for i := range d.Prune {
		each(&d.Prune[i])
	}
}

// redacted stands for a Secret value in a diff.
const redacted = "(redacted)"

// definitions are the CRDs and Namespaces a plan applies: an object of a
// kind one of its CRDs defines, or in a Namespace it creates, cannot be
// dry-run before they exist.
type definitions struct {
	kinds      map[schema.GroupKind]bool
	namespaces map[string]bool
}

func planDefinitions(plan *Plan) definitions {
	defs := definitions{kinds: map[schema.GroupKind]bool{}, namespaces: map[string]bool{}}
	for _, obj := range plan.AppliedObjects() {
		switch {
		case isCRD(obj):
			group, _, _ := unstructured.NestedString(obj.Object, "spec", "group")
			kind, _, _ := unstructured.NestedString(obj.Object, "spec", "names", "kind")
			defs.kinds[schema.GroupKind{Group: group, Kind: kind}] = true
		case obj.GroupVersionKind().Group == "" && obj.GetKind() == "Namespace":
			defs.namespaces[obj.GetName()] = true
		}
	}
	return defs
}

// explains returns why a dry run of obj failed with err because of a
// definition the plan applies first, or "".
func (d definitions) explains(obj *unstructured.Unstructured, err error) string {
	gk := obj.GroupVersionKind().GroupKind()
	if meta.IsNoMatchError(err) && d.kinds[gk] {
		return "its CustomResourceDefinition is created by this plan first; the server cannot check it before"
	}
	if apierrors.IsNotFound(err) && obj.GetNamespace() != "" && d.namespaces[obj.GetNamespace()] {
		return noteNamespacePending
	}
	return ""
}

// noteNamespacePending is the note of a create whose namespace an
// earlier object of the plan creates.
const noteNamespacePending = "its Namespace is created by this plan first; the server cannot check it before"

package stages

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/google/cel-go/checker"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// PreflightReason is the reason of the Ready and Stalled conditions of a
// deployment whose revision did not pass preflight.
const PreflightReason = "PreflightFailed"

// PreflightOptions tune CheckPlan and Preflight.
type PreflightOptions struct {
	// File returns the file an object came from, or "" when it is not
	// known. Nil reads kustomize's origin annotation only.
	File func(*unstructured.Unstructured) string
	// Skip marks objects already known to be wrong (a ${VAR} left unset):
	// no dry run is sent for them, since it would only repeat the problem.
	Skip func(*unstructured.Unstructured) bool
	// Unchanged, when set, names the objects whose dry run cannot answer
	// anything new: their content is that of Capstan's last apply and the
	// live object is still the one it left, with the UID and
	// resourceVersion Unchanged returns. No dry run is sent for them; with
	// Keep, the apply takes the live object as the answer while it is that
	// one (DryRuns.keepLive), and goes its normal way otherwise. The caller
	// answers false for every object once the plan changes admission (a
	// CRD, a webhook configuration, an APIService) since that apply.
	Unchanged func(*unstructured.Unstructured) (uid types.UID, resourceVersion string, ok bool)
	// Here reports whether the i-th stage of the plan acts on the
	// executor's cluster. The cluster checks (served kinds, namespaces,
	// dry run) look only at the objects of those stages: a stage that acts
	// on another cluster, often one an earlier stage builds, cannot be
	// checked before that cluster is there. Nil means every stage.
	Here func(i int) bool
	// Keep, when set, keeps the answers of the dry runs for the stages'
	// applies (RunOptions.DryRuns), except for the stages from the first
	// one that applies an object changing admission (a CRD, a webhook
	// configuration, an APIService) on: the server may answer them
	// differently once it is applied.
	Keep *DryRuns
	// keepIn names the stages whose answers Keep keeps (keepIn).
	keepIn map[string]bool
}

func (o PreflightOptions) fileOf(obj *unstructured.Unstructured) string {
	if o.File != nil {
		if f := o.File(obj); f != "" {
			return f
		}
	}
	return originFile(obj)
}

// keepIn returns the names of the stages of plan before the first one
// that applies an object changing admission (ChangesAdmission): the
// stages whose dry-run answers may be kept.
func keepIn(plan *Plan) map[string]bool {
	names := map[string]bool{}
	for _, stage := range plan.Stages {
		if stage.Action != capstanv1.StageActionApply && stage.Action != "" {
			names[stage.Name] = true
			continue
		}
		if slices.ContainsFunc(stage.Objects, ChangesAdmission) {
			break
		}
		names[stage.Name] = true
	}
	return names
}

// keeps reports whether the dry-run answers of stage are kept.
func (o PreflightOptions) keeps(stage string) bool {
	return o.Keep != nil && o.keepIn[stage]
}

// CheckPlan is the judgement of the preflight checks that need no
// cluster, over a plan BuildPlan built:
//
//   - every apply, wait, rollout, scale and delete stage selects at least
//     one object, unless it sets allowEmpty (a stage that selects nothing
//     is most often a typo in its select, or objects without their
//     capstan.dev/stage label);
//   - every readiness expression stays within the CEL cost limit on any
//     object of realistic size (celSizeBound): one that could exceed it
//     would fail at every evaluation. BuildPlan already refused those that
//     do not compile.
func CheckPlan(plan *Plan) []preflight.Problem {
	var problems []preflight.Problem
	for _, stage := range plan.Stages {
		ref := "stage " + stage.Name
		switch stage.Action {
		case capstanv1.StageActionValidate, capstanv1.StageActionPivot:
		default:
			if len(stage.Objects) == 0 && !stage.AllowEmpty {
				problems = append(problems, preflight.Problem{Object: ref, Field: "select",
					Message: fmt.Sprintf("selects no object: no rendered object is labelled %s: %s and select matches none; fix select or the labels, or set allowEmpty: true on a stage that may be empty",
						StageKey, stage.Name)})
			}
		}
		for i, check := range stage.ReadyWhen {
			for _, f := range [][2]string{{"cel", check.CEL}, {"messageExpression", check.MessageExpression}} {
				field, expr := f[0], f[1]
				if expr == "" {
					continue
				}
				if cost, err := estimateCost(expr); err == nil && cost > celCostLimit {
					problems = append(problems, preflight.Problem{Object: ref, Field: fmt.Sprintf("readyWhen[%d].%s", i, field),
						Message: fmt.Sprintf("may cost up to %d on an object with %d-item lists, more than the CEL cost limit %d: it would fail on such objects; avoid nested loops over lists",
							cost, celSizeBound, celCostLimit)})
				}
			}
		}
	}
	return problems
}

// celSizeBound is the size CheckPlan assumes for every list, map and
// string an expression reads of an object, whose schema it does not know.
// Kubernetes bounds an object to about 1.5 MiB, which would bound nothing
// useful; a thousand conditions, machines or addresses is more than any
// object Capstan waits for holds.
const celSizeBound = 1024

// estimateCost is the worst-case cost of one readiness expression.
func estimateCost(expr string) (uint64, error) {
	env, err := celEnv()
	if err != nil {
		return 0, err
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		return 0, iss.Err()
	}
	est, err := env.EstimateCost(ast, boundedSizes{})
	if err != nil {
		return 0, err
	}
	return est.Max, nil
}

// boundedSizes gives every value of unknown size celSizeBound.
type boundedSizes struct{}

func (boundedSizes) EstimateSize(checker.AstNode) *checker.SizeEstimate {
	return &checker.SizeEstimate{Min: 0, Max: celSizeBound}
}

func (boundedSizes) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}

// Preflight checks a revision's plan before its first stage applies
// anything, and returns every problem at once, in plan order:
//
//   - CheckPlan: stages that select nothing, readiness expressions over
//     the CEL cost limit;
//   - CheckServed: each object's apiVersion and kind is served by the
//     cluster, or defined by a CustomResourceDefinition the plan applies
//     before it; a deprecated version is a warning;
//   - each namespaced object's namespace exists, or a Namespace object the
//     plan applies before it creates it (within a stage, Namespaces go
//     first);
//   - the API server accepts each object whose kind and namespace exist
//     already: a server-side dry-run apply, as the stage would send it
//     (the mechanism of DiffPlan), so that schema and admission errors
//     show before anything changes. Objects whose kind or namespace the
//     plan creates first cannot be dry-run yet: they are checked against
//     their schemas instead (checkSchemas), the cluster's or that of a
//     CRD the plan applies before them.
//
// An executor without a client runs CheckPlan alone. The error is for a
// cluster that could not be asked; retrying may help.
func (e *Executor) Preflight(ctx context.Context, plan *Plan, owner Owner, opts PreflightOptions) (preflight.Report, error) {
	report := preflight.Report{Problems: CheckPlan(plan)}
	if e.client == nil {
		return report, nil
	}
	if e.cluster != nil {
		if err := e.cluster.CheckAvailable(ctx); err != nil {
			return report, &UnreachableError{Cluster: e.cluster.Name(), Err: err}
		}
	}
	here := &Plan{}
	for i, stage := range plan.Stages {
		if opts.Here == nil || opts.Here(i) {
			here.Stages = append(here.Stages, stage)
		}
	}
	objects, stageOf := appliedWithStage(here)
	served, err := LookupServed(ctx, e.client, e.client.RESTMapper(), objects)
	if err != nil {
		return report, fmt.Errorf("look up the APIs the cluster serves: %w", err)
	}
	servedProblems := checkServed(objects, served, opts.fileOf)
	bad := map[*unstructured.Unstructured]bool{}
	// checkServed reports in object order, one problem at most per object.
	for _, p := range servedProblems {
		if p.Warning {
			continue
		}
		for _, obj := range objects {
			if problemRef(obj) == p.Object && !bad[obj] {
				bad[obj] = true
				break
			}
		}
	}
	report.Problems = append(report.Problems, servedProblems...)
	report.Problems = append(report.Problems, checkReadVersions(here, objects, served)...)

	nsProblems, checkable, later, err := e.checkNamespaces(ctx, objects, stageOf, served, bad, opts)
	if err != nil {
		return report, err
	}
	report.Problems = append(report.Problems, nsProblems...)

	if len(later) > 0 {
		found, err := e.checkLater(ctx, objects, later, stageOf, served, owner, opts)
		if err != nil {
			return report, err
		}
		report.Problems = append(report.Problems, found...)
	}

	opts.keepIn = keepIn(plan)
	dry, err := e.dryRunAll(ctx, checkable, stageOf, owner, planDefinitions(here), opts)
	if err != nil {
		return report, err
	}
	report.Problems = append(report.Problems, dry...)
	return report, nil
}

// appliedWithStage returns the objects the plan applies, in order, and
// the stage that applies each.
func appliedWithStage(plan *Plan) ([]*unstructured.Unstructured, map[*unstructured.Unstructured]string) {
	stageOf := map[*unstructured.Unstructured]string{}
	var objects []*unstructured.Unstructured
	for _, stage := range plan.Stages {
		if stage.Action != capstanv1.StageActionApply && stage.Action != "" {
			continue
		}
		first, rest := splitDefinitions(stage.Objects)
		for _, obj := range append(first, rest...) {
			if _, dup := stageOf[obj]; dup || obj == nil || obj.Object == nil {
				continue
			}
			stageOf[obj] = stage.Name
			objects = append(objects, obj)
		}
	}
	return objects, stageOf
}

// namespaceHint is how a missing namespace is fixed.
const namespaceHint = "add a Namespace object or set `namespace:` in kustomization.yaml"

// checkNamespaces checks that each namespaced object has a namespace that
// exists, or that a Namespace the plan applies before it creates. It
// returns the objects a dry run can check now: of a kind the cluster
// serves in their version, in a namespace that exists (or none); and
// those it cannot check yet, since an earlier stage creates their
// namespace or their kind, for the schema check.
func (e *Executor) checkNamespaces(ctx context.Context, objects []*unstructured.Unstructured, stageOf map[*unstructured.Unstructured]string,
	served ServedAPIs, bad map[*unstructured.Unstructured]bool, opts PreflightOptions) ([]preflight.Problem, []*unstructured.Unstructured, map[*unstructured.Unstructured]bool, error) {
	var problems []preflight.Problem
	var checkable []*unstructured.Unstructured
	later := map[*unstructured.Unstructured]bool{}
	created := map[string]bool{}     // by a Namespace the plan applied so far
	createdBy := map[string]string{} // every Namespace of the plan: its stage
	for _, obj := range objects {
		if obj.GroupVersionKind().GroupKind() == (schema.GroupKind{Kind: "Namespace"}) {
			if _, ok := createdBy[obj.GetName()]; !ok {
				createdBy[obj.GetName()] = stageOf[obj]
			}
		}
	}
	exists := map[string]bool{}
	existing := func(ns string) (bool, error) {
		if v, ok := exists[ns]; ok {
			return v, nil
		}
		if e.namespaces.found(e, ns, time.Now()) {
			exists[ns] = true
			return true, nil
		}
		err := e.client.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{})
		switch {
		case err == nil:
			exists[ns] = true
			e.namespaces.saw(e, ns, time.Now())
		case apierrors.IsNotFound(err):
			exists[ns] = false
		case apierrors.IsForbidden(err):
			// Not ours to read: the apply will tell.
			exists[ns] = true
		default:
			return false, fmt.Errorf("look up Namespace %s: %w", ns, err)
		}
		return exists[ns], nil
	}
	scopes := map[schema.GroupKind]bool{} // namespaced, by the plan's CRDs so far
	for _, obj := range objects {
		gvk := obj.GroupVersionKind()
		if gk, namespaced, ok := crdScope(obj); ok {
			scopes[gk] = namespaced
		}
		if gvk.GroupKind() == (schema.GroupKind{Kind: "Namespace"}) {
			created[obj.GetName()] = true
		}
		if bad[obj] {
			continue
		}
		servedNow := servesVersion(served, gvk)
		namespaced, known := scopes[gvk.GroupKind()]
		if !known && servedNow {
			m, err := e.client.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				continue
			}
			namespaced, known = m.Scope.Name() == meta.RESTScopeNameNamespace, true
		}
		if !known {
			continue
		}
		ns := obj.GetNamespace()
		file := inFile(opts.fileOf(obj))
		switch {
		case !namespaced:
			if servedNow {
				checkable = append(checkable, obj)
			} else {
				later[obj] = true
			}
		case ns == "":
			problems = append(problems, preflight.Problem{Object: problemRef(obj), Field: "metadata.namespace",
				Message: fmt.Sprintf("%s is namespaced and the object names no namespace: %s%s", gvk.Kind, namespaceHint, file)})
		case created[ns]:
			// Created first; the server cannot check the object before.
			if ok, err := existing(ns); err != nil {
				return nil, nil, nil, err
			} else if ok && servedNow {
				checkable = append(checkable, obj)
			} else {
				later[obj] = true
			}
		default:
			ok, err := existing(ns)
			if err != nil {
				return nil, nil, nil, err
			}
			if ok {
				if servedNow {
					checkable = append(checkable, obj)
				} else {
					later[obj] = true
				}
				continue
			}
			msg := fmt.Sprintf("namespace %s does not exist and no stage before %s creates it: %s", ns, stageOf[obj], namespaceHint)
			if later, ok := createdBy[ns]; ok {
				msg = fmt.Sprintf("namespace %s is created by stage %s, after this object's stage %s: move the Namespace to an earlier stage", ns, later, stageOf[obj])
			}
			problems = append(problems, preflight.Problem{Object: problemRef(obj), Field: "metadata.namespace", Message: msg + file})
		}
	}
	return problems, checkable, later, nil
}

// servesVersion reports whether the cluster serves gvk now.
func servesVersion(served ServedAPIs, gvk schema.GroupVersionKind) bool {
	for _, v := range served.Kinds[gvk.GroupKind()] {
		if v.Version == gvk.Version {
			return true
		}
	}
	return false
}

// crdScope reads whether the kind a CustomResourceDefinition defines is
// namespaced.
func crdScope(obj *unstructured.Unstructured) (schema.GroupKind, bool, bool) {
	if !isCRD(obj) {
		return schema.GroupKind{}, false, false
	}
	group, _, _ := unstructured.NestedString(obj.Object, "spec", "group")
	kind, _, _ := unstructured.NestedString(obj.Object, "spec", "names", "kind")
	scope, _, _ := unstructured.NestedString(obj.Object, "spec", "scope")
	return schema.GroupKind{Group: group, Kind: kind}, scope != "Cluster", kind != ""
}

// dryRunAll sends the server-side dry-run apply of each object, as its
// stage would apply it, and reports each one the server refuses with the
// field it names. A refusal other than Invalid (a webhook that does not
// answer yet, RBAC) is a warning: the apply may still succeed.
func (e *Executor) dryRunAll(ctx context.Context, objects []*unstructured.Unstructured, stageOf map[*unstructured.Unstructured]string,
	owner Owner, pending definitions, opts PreflightOptions) ([]preflight.Problem, error) {
	var check []*unstructured.Unstructured
	now := time.Now()
	for _, obj := range objects {
		if opts.Skip != nil && opts.Skip(obj) {
			continue
		}
		if opts.Unchanged != nil {
			if uid, version, ok := opts.Unchanged(obj); ok {
				if stage := stageOf[obj]; opts.keeps(stage) {
					opts.Keep.keepLive(stage, obj, uid, version, now)
				}
				continue
			}
		}
		check = append(check, obj)
	}
	found := make([]*preflight.Problem, len(check))
	errs := make([]error, len(check))
	e.each(check, func(i int, obj *unstructured.Unstructured) {
		found[i], errs[i] = e.dryRunOne(ctx, obj, stageOf[obj], owner, pending, opts)
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var problems []preflight.Problem
	for _, p := range found {
		if p != nil {
			problems = append(problems, *p)
		}
	}
	return problems, nil
}

func (e *Executor) dryRunOne(ctx context.Context, obj *unstructured.Unstructured, stage string, owner Owner,
	pending definitions, opts PreflightOptions) (*preflight.Problem, error) {
	applied := ownedBy(obj, stage, owner)
	err := e.client.Patch(ctx, applied, client.Apply, client.DryRunAll, client.ForceOwnership, client.FieldOwner(FieldManager))
	if err == nil {
		if opts.keeps(stage) {
			opts.Keep.keep(stage, obj, applied, time.Now())
		}
		return nil, nil
	}
	if pending.explains(obj, err) != "" {
		return nil, nil
	}
	look := e.lookFailed(newObjectDiff(obj), obj, "dry-run", err)
	if look.err != nil {
		return nil, look.err
	}
	p := &preflight.Problem{Object: problemRef(obj), Field: look.diff.Field}
	msg := serverMessage(err)
	if field, why := typedPatchField(err); field != "" && p.Field == "" {
		p.Field, msg = field, why
		if why == "field not declared in schema" {
			msg = fmt.Sprintf("the schema of %s %s declares no such field; check its spelling and the apiVersion", obj.GetAPIVersion(), obj.GetKind())
		}
	}
	if look.diff.Action == DiffInvalid {
		p.Message = "the API server refuses the object (dry run): " + msg
	} else {
		p.Warning = true
		p.Message = "could not be checked by a dry run: " + msg
	}
	p.Message += inFile(opts.fileOf(obj))
	return p, nil
}

// serverMessage is what the API server said, without the client's
// wrapping.
func serverMessage(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Message != "" {
		return status.Status().Message
	}
	return err.Error()
}

// typedPatchRE finds the field in server-side apply's answer to a value
// that does not fit the schema ("failed to create typed patch object
// (...): .spec.size: expected numeric ..."), which names no cause.
var typedPatchRE = regexp.MustCompile(`typed patch object \([^)]*\): \.([^:\s]+): (.+)$`)

// typedPatchField returns the field and the problem such an answer names.
func typedPatchField(err error) (string, string) {
	if m := typedPatchRE.FindStringSubmatch(err.Error()); m != nil {
		return m[1], m[2]
	}
	return "", ""
}

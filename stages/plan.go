package stages

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
)

// StageKey is the label or annotation that pins a rendered object to a stage.
const StageKey = "capstan.dev/stage"

// Stage is one step of a plan with the rendered objects it applies or checks.
type Stage struct {
	capstanv1.StageSpec
	// Objects are applied by an apply stage, or only checked by a wait stage.
	Objects []*unstructured.Unstructured
	// PlanObjects, set by BuildPlan on a validate or pivot stage, are
	// every object the plan applies, in the order it applies them: a
	// validate stage checks that the cluster serves each one's apiVersion
	// and kind, a pivot stage finds those marked bootstrap-only.
	PlanObjects []*unstructured.Unstructured
}

// Plan is an ordered list of stages. A stage is not started before every
// earlier stage is Ready.
type Plan struct {
	Stages []Stage
	// DryRuns, when set, keeps the answers of the preflight's dry runs of
	// this plan (PreflightOptions.Keep) for its stages' applies
	// (RunOptions.DryRuns): they are about this revision's objects, so
	// they live and go with its plan.
	DryRuns *DryRuns
	// Files holds the file each object was rendered from, relative to
	// the source's root, where render knew it: problems name it.
	Files map[*unstructured.Unstructured]string
}

// Names returns the stage names in order.
func (p *Plan) Names() []string {
	names := make([]string, len(p.Stages))
	for i, s := range p.Stages {
		names[i] = s.Name
	}
	return names
}

// Drop removes the objects drop selects from every stage: the stage
// applies, scales or waits for the others. A deployment that moved out of
// its bootstrap cluster drops the objects that serve only the bootstrap.
// A stage left with nothing by the drop (the bootstrap profile's stages
// that install and scale the bootstrap's providers) is empty by design,
// not by a typo: it may be (AllowEmpty), and passes at once.
func (p *Plan) Drop(drop func(*unstructured.Unstructured) bool) {
	for i := range p.Stages {
		st := &p.Stages[i]
		had := len(st.Objects)
		st.Objects = slices.DeleteFunc(st.Objects, drop)
		if had > 0 && len(st.Objects) == 0 {
			st.AllowEmpty = true
		}
		if st.PlanObjects != nil {
			st.PlanObjects = slices.DeleteFunc(slices.Clone(st.PlanObjects), drop)
		}
	}
}

// BuildPlan assigns the rendered objects to the given stages. Objects of an
// apply stage are the ones labelled or annotated with its name plus the ones
// its selector matches first; a wait stage checks the objects its selector
// matches, whichever stage applies them. Every problem is reported at once:
// an unknown stage name on an object, an object no stage applies, a
// duplicate stage, an invalid selector, a readiness check that does not
// compile.
func BuildPlan(specs []capstanv1.StageSpec, objects []*unstructured.Unstructured) (*Plan, error) {
	var errs []error
	plan := &Plan{Stages: make([]Stage, len(specs))}
	index := map[string]int{}
	selectors := make([]matcher, len(specs))
	for i, spec := range specs {
		if spec.Action == "" {
			spec.Action = capstanv1.StageActionApply
		}
		plan.Stages[i] = Stage{StageSpec: spec}
		if _, dup := index[spec.Name]; dup {
			errs = append(errs, fmt.Errorf("stages[%d].name: stage %q is defined twice", i, spec.Name))
		}
		index[spec.Name] = i
		m, err := newMatcher(spec.Select)
		if err != nil {
			errs = append(errs, fmt.Errorf("stages[%d].select.labelSelector: %w", i, err))
		}
		selectors[i] = m
		if err := checkScale(spec); err != nil {
			errs = append(errs, fmt.Errorf("stages[%d].%w", i, err))
		}
		// Compile the readiness checks now, so that a typo in a late
		// stage stops the plan before an early stage is applied.
		if _, err := NewChecker(spec.ReadyWhen); err != nil {
			for _, err := range unjoin(err) {
				errs = append(errs, fmt.Errorf("stages[%d].%w", i, err))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	for _, obj := range objects {
		owner := -1
		if name := pinnedStage(obj); name != "" {
			i, ok := index[name]
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("%s: %s %q names no stage of the plan (stages: %s)",
					ObjectRef(obj), StageKey, name, strings.Join(plan.Names(), ", ")))
				continue
			case plan.Stages[i].Action != capstanv1.StageActionApply:
				errs = append(errs, fmt.Errorf("%s: %s %q is a %s stage, which applies nothing",
					ObjectRef(obj), StageKey, name, plan.Stages[i].Action))
				continue
			}
			owner = i
		}
		deleted := false
		for i := range plan.Stages {
			if !selectors[i].matches(obj) {
				continue
			}
			if plan.Stages[i].Action == capstanv1.StageActionApply {
				if owner < 0 {
					owner = i
				}
				continue
			}
			deleted = deleted || plan.Stages[i].Action == capstanv1.StageActionDelete
			plan.Stages[i].Objects = append(plan.Stages[i].Objects, obj)
		}
		if owner < 0 && deleted {
			// Committed only to say that it must be gone.
			continue
		}
		if owner < 0 {
			errs = append(errs, fmt.Errorf("%s: no apply stage selects this object; add the label %s: <stage> or widen a stage's select",
				ObjectRef(obj), StageKey))
			continue
		}
		plan.Stages[owner].Objects = append(plan.Stages[owner].Objects, obj)
	}
	errs = append(errs, rolloutOwnedFields(plan)...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	for i := range plan.Stages {
		if a := plan.Stages[i].Action; a == capstanv1.StageActionValidate || a == capstanv1.StageActionPivot {
			plan.Stages[i].PlanObjects = plan.AppliedObjects()
		}
	}
	return plan, nil
}

// checkScale checks what a scale stage sets: one count, or each
// workload's committed one (the CRD says the same for deployments; the
// profiles and files the CLI reads do not pass through it).
func checkScale(spec capstanv1.StageSpec) error {
	sc := spec.Scale
	switch {
	case spec.Action != capstanv1.StageActionScale:
		return nil
	case sc == nil || (sc.Replicas == nil && !sc.Committed):
		return fmt.Errorf("scale: stage %s sets no count: give scale.replicas (0 disables, 1 or more enables) or scale.committed: true", spec.Name)
	case sc.Replicas != nil && sc.Committed:
		return fmt.Errorf("scale: stage %s: scale.committed takes each workload's count from its rendered object: leave scale.replicas out", spec.Name)
	case sc.Replicas != nil && *sc.Replicas < 0:
		return fmt.Errorf("scale.replicas: stage %s: %d: want 0 or more", spec.Name, *sc.Replicas)
	}
	return nil
}

// rolloutOwnedFields refuses LCMMachines that a rollout stage drives but
// that set spec.stateItems themselves: the rollout owns that field, and
// both writers forcing it would hand the machine different items at every
// revision.
func rolloutOwnedFields(plan *Plan) []error {
	var errs []error
	seen := map[*unstructured.Unstructured]bool{}
	for _, stage := range plan.Stages {
		if stage.Action != capstanv1.StageActionRollout {
			continue
		}
		for _, obj := range stage.Objects {
			if seen[obj] || obj.GroupVersionKind().GroupKind() != lcmMachineGVK.GroupKind() {
				continue
			}
			seen[obj] = true
			if _, found, _ := unstructured.NestedFieldNoCopy(obj.Object, "spec", "stateItems"); found {
				errs = append(errs, fmt.Errorf("%s: spec.stateItems: set by the rollout of stage %s, from the LCMCluster's machineTypes; leave it out of the committed LCMMachine",
					ObjectRef(obj), stage.Name))
			}
		}
	}
	return errs
}

// unjoin returns the errors err joins, or err alone; a failure.Error
// around a join (NewChecker's) is looked through.
func unjoin(err error) []error {
	if f, ok := err.(*failure.Error); ok {
		err = f.Err
	}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		return joined.Unwrap()
	}
	return []error{err}
}

func pinnedStage(obj *unstructured.Unstructured) string {
	if v := obj.GetLabels()[StageKey]; v != "" {
		return v
	}
	return obj.GetAnnotations()[StageKey]
}

// matcher is a compiled Selector.
type matcher struct {
	kinds  []string
	names  []string
	labels labels.Selector
	empty  bool
}

func newMatcher(s capstanv1.Selector) (matcher, error) {
	m := matcher{kinds: s.Kinds, names: s.Names}
	m.empty = len(s.Kinds) == 0 && len(s.Names) == 0 && s.LabelSelector == nil
	if s.LabelSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(s.LabelSelector)
		if err != nil {
			return m, err
		}
		m.labels = sel
	}
	return m, nil
}

func (m matcher) matches(obj *unstructured.Unstructured) bool {
	if m.empty {
		return false
	}
	if len(m.kinds) > 0 && !slices.ContainsFunc(m.kinds, func(k string) bool { return KindMatches(k, obj) }) {
		return false
	}
	if len(m.names) > 0 && !slices.Contains(m.names, obj.GetName()) {
		return false
	}
	if m.labels != nil && !m.labels.Matches(labels.Set(obj.GetLabels())) {
		return false
	}
	return true
}

// KindMatches reports whether kind, written as `Kind`, `group/Kind` or `*`,
// names the object's kind.
func KindMatches(kind string, obj *unstructured.Unstructured) bool {
	if kind == "*" {
		return true
	}
	gvk := obj.GroupVersionKind()
	if group, k, ok := strings.Cut(kind, "/"); ok {
		return group == gvk.Group && k == gvk.Kind
	}
	return kind == gvk.Kind
}

// ObjectRef names an object as Kind/namespace/name (Kind/name when cluster-scoped).
func ObjectRef(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return obj.GetKind() + "/" + ns + "/" + obj.GetName()
	}
	return obj.GetKind() + "/" + obj.GetName()
}

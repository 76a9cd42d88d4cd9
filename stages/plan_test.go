package stages_test

import (
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
	"k8s.io/utils/ptr"
)

// object builds a rendered object; mods add labels or annotations.
func object(apiVersion, kind, namespace, name string, mods ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	u.SetNamespace(namespace)
	u.SetName(name)
	for _, mod := range mods {
		mod(u)
	}
	return u
}

func labelled(key, value string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		l := u.GetLabels()
		if l == nil {
			l = map[string]string{}
		}
		l[key] = value
		u.SetLabels(l)
	}
}

func annotated(key, value string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		a := u.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		a[key] = value
		u.SetAnnotations(a)
	}
}

func applyStage(name string, sel capstanv1.Selector) capstanv1.StageSpec {
	return capstanv1.StageSpec{Name: name, Action: capstanv1.StageActionApply, Select: sel}
}

func waitStage(name string, sel capstanv1.Selector) capstanv1.StageSpec {
	return capstanv1.StageSpec{Name: name, Action: capstanv1.StageActionWait, Select: sel}
}

func kinds(k ...string) capstanv1.Selector { return capstanv1.Selector{Kinds: k} }

var everything = kinds("*")

// planCases pin how BuildPlan assigns objects. want maps a stage to the
// objects it holds, as ObjectRefs in input order; stages not listed hold
// none. wantErr lists substrings the error must hold, and wantErrs how many
// problems errors.Join reports.
var planCases = []struct {
	name     string
	specs    []capstanv1.StageSpec
	objects  []*unstructured.Unstructured
	want     map[string][]string
	wantErr  []string
	wantErrs int
}{
	{
		name:  "object labelled capstan.dev/stage goes to that stage, ahead of an earlier selector",
		specs: []capstanv1.StageSpec{applyStage("Infra", everything), applyStage("Apps", capstanv1.Selector{})},
		objects: []*unstructured.Unstructured{
			object("v1", "ConfigMap", "ns", "pinned", labelled(stages.StageKey, "Apps")),
			object("v1", "ConfigMap", "ns", "free"),
		},
		want: map[string][]string{"Infra": {"ConfigMap/ns/free"}, "Apps": {"ConfigMap/ns/pinned"}},
	},
	{
		name:    "annotation capstan.dev/stage works too",
		specs:   []capstanv1.StageSpec{applyStage("Infra", everything), applyStage("Apps", capstanv1.Selector{})},
		objects: []*unstructured.Unstructured{object("v1", "ConfigMap", "ns", "pinned", annotated(stages.StageKey, "Apps"))},
		want:    map[string][]string{"Apps": {"ConfigMap/ns/pinned"}},
	},
	{
		name:  "label wins over annotation",
		specs: []capstanv1.StageSpec{applyStage("A", capstanv1.Selector{}), applyStage("B", capstanv1.Selector{})},
		objects: []*unstructured.Unstructured{
			object("v1", "ConfigMap", "ns", "both", labelled(stages.StageKey, "B"), annotated(stages.StageKey, "A")),
		},
		want: map[string][]string{"B": {"ConfigMap/ns/both"}},
	},
	{
		name:  "first matching apply stage owns an object",
		specs: []capstanv1.StageSpec{applyStage("Config", kinds("ConfigMap")), applyStage("Rest", everything)},
		objects: []*unstructured.Unstructured{
			object("v1", "ConfigMap", "ns", "cm"),
			object("v1", "Secret", "ns", "s"),
		},
		want: map[string][]string{"Config": {"ConfigMap/ns/cm"}, "Rest": {"Secret/ns/s"}},
	},
	{
		name: "wait stage lists objects without owning them",
		specs: []capstanv1.StageSpec{
			applyStage("Apply", everything),
			waitStage("Rollout", kinds("apps/Deployment")),
		},
		objects: []*unstructured.Unstructured{
			object("apps/v1", "Deployment", "ns", "web"),
			object("v1", "Service", "ns", "web"),
		},
		want: map[string][]string{
			"Apply":   {"Deployment/ns/web", "Service/ns/web"},
			"Rollout": {"Deployment/ns/web"},
		},
	},
	{
		name: "wait stage lists a pinned object too",
		specs: []capstanv1.StageSpec{
			applyStage("Apply", capstanv1.Selector{}),
			waitStage("Rollout", kinds("Deployment")),
		},
		objects: []*unstructured.Unstructured{object("apps/v1", "Deployment", "ns", "web", labelled(stages.StageKey, "Apply"))},
		want:    map[string][]string{"Apply": {"Deployment/ns/web"}, "Rollout": {"Deployment/ns/web"}},
	},
	{
		name:  "kind group/Kind matches only that group",
		specs: []capstanv1.StageSpec{applyStage("Apps", kinds("apps/Deployment")), applyStage("Rest", everything)},
		objects: []*unstructured.Unstructured{
			object("apps/v1", "Deployment", "ns", "real"),
			object("example.com/v1", "Deployment", "ns", "lookalike"),
		},
		want: map[string][]string{"Apps": {"Deployment/ns/real"}, "Rest": {"Deployment/ns/lookalike"}},
	},
	{
		name:  "kind /Kind names the core group",
		specs: []capstanv1.StageSpec{applyStage("Core", kinds("/Secret")), applyStage("Rest", everything)},
		objects: []*unstructured.Unstructured{
			object("v1", "Secret", "ns", "core"),
			object("example.com/v1", "Secret", "ns", "custom"),
		},
		want: map[string][]string{"Core": {"Secret/ns/core"}, "Rest": {"Secret/ns/custom"}},
	},
	{
		name:  "bare Kind matches that kind in every group",
		specs: []capstanv1.StageSpec{applyStage("Deployments", kinds("Deployment")), applyStage("Rest", everything)},
		objects: []*unstructured.Unstructured{
			object("apps/v1", "Deployment", "ns", "real"),
			object("example.com/v1", "Deployment", "ns", "lookalike"),
			object("v1", "ConfigMap", "ns", "cm"),
		},
		want: map[string][]string{"Deployments": {"Deployment/ns/real", "Deployment/ns/lookalike"}, "Rest": {"ConfigMap/ns/cm"}},
	},
	{
		name:  "kind * matches every object, cluster-scoped ones included",
		specs: []capstanv1.StageSpec{applyStage("All", everything)},
		objects: []*unstructured.Unstructured{
			object("v1", "Namespace", "", "team"),
			object("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", "widgets.example.com"),
		},
		want: map[string][]string{"All": {"Namespace/team", "CustomResourceDefinition/widgets.example.com"}},
	},
	{
		name:  "names select by metadata.name",
		specs: []capstanv1.StageSpec{applyStage("First", capstanv1.Selector{Names: []string{"a", "c"}}), applyStage("Rest", everything)},
		objects: []*unstructured.Unstructured{
			object("v1", "ConfigMap", "ns", "a"),
			object("v1", "ConfigMap", "ns", "b"),
			object("v1", "Secret", "ns", "c"),
		},
		want: map[string][]string{"First": {"ConfigMap/ns/a", "Secret/ns/c"}, "Rest": {"ConfigMap/ns/b"}},
	},
	{
		name: "labelSelector selects by labels, matchExpressions included",
		specs: []capstanv1.StageSpec{
			applyStage("Tier", capstanv1.Selector{LabelSelector: &metav1.LabelSelector{
				MatchLabels:      map[string]string{"app": "web"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"front", "edge"}}},
			}}),
			applyStage("Rest", everything),
		},
		objects: []*unstructured.Unstructured{
			object("v1", "ConfigMap", "ns", "front", labelled("app", "web"), labelled("tier", "front")),
			object("v1", "ConfigMap", "ns", "back", labelled("app", "web"), labelled("tier", "back")),
			object("v1", "ConfigMap", "ns", "other", labelled("app", "db"), labelled("tier", "edge")),
		},
		want: map[string][]string{"Tier": {"ConfigMap/ns/front"}, "Rest": {"ConfigMap/ns/back", "ConfigMap/ns/other"}},
	},
	{
		name:  "every set field of a selector must match",
		specs: []capstanv1.StageSpec{applyStage("Narrow", capstanv1.Selector{Kinds: []string{"Secret"}, Names: []string{"x"}}), applyStage("Rest", everything)},
		objects: []*unstructured.Unstructured{
			object("v1", "Secret", "ns", "x"),
			object("v1", "Secret", "ns", "y"),
			object("v1", "ConfigMap", "ns", "x"),
		},
		want: map[string][]string{"Narrow": {"Secret/ns/x"}, "Rest": {"Secret/ns/y", "ConfigMap/ns/x"}},
	},
	{
		name:    "empty selector selects nothing",
		specs:   []capstanv1.StageSpec{applyStage("Empty", capstanv1.Selector{}), applyStage("Rest", everything)},
		objects: []*unstructured.Unstructured{object("v1", "ConfigMap", "ns", "cm")},
		want:    map[string][]string{"Rest": {"ConfigMap/ns/cm"}},
	},
	{
		name:    "action defaults to apply",
		specs:   []capstanv1.StageSpec{{Name: "Implicit", Select: everything}},
		objects: []*unstructured.Unstructured{object("v1", "ConfigMap", "ns", "cm")},
		want:    map[string][]string{"Implicit": {"ConfigMap/ns/cm"}},
	},
	{
		name:  "no objects gives empty stages",
		specs: []capstanv1.StageSpec{applyStage("A", everything), waitStage("W", everything)},
		want:  map[string][]string{},
	},
	{
		name:    "object no stage selects is an error naming Kind/ns/name and the fix",
		specs:   []capstanv1.StageSpec{applyStage("Config", kinds("ConfigMap"))},
		objects: []*unstructured.Unstructured{object("v1", "Secret", "team", "orphan")},
		wantErr: []string{"Secret/team/orphan", "no apply stage selects this object", "capstan.dev/stage: <stage>", "widen a stage's select"},
	},
	{
		name:    "cluster-scoped object is named Kind/name",
		specs:   []capstanv1.StageSpec{applyStage("Config", kinds("ConfigMap"))},
		objects: []*unstructured.Unstructured{object("v1", "Namespace", "", "team")},
		wantErr: []string{"Namespace/team: no apply stage"},
	},
	{
		name:    "object only a wait stage selects is applied by none, an error",
		specs:   []capstanv1.StageSpec{applyStage("Config", kinds("ConfigMap")), waitStage("Wait", everything)},
		objects: []*unstructured.Unstructured{object("v1", "Secret", "ns", "s")},
		wantErr: []string{"Secret/ns/s: no apply stage selects this object"},
	},
	{
		name:    "label naming an unknown stage is an error listing the stages",
		specs:   []capstanv1.StageSpec{applyStage("Infra", everything), applyStage("Apps", everything)},
		objects: []*unstructured.Unstructured{object("v1", "ConfigMap", "ns", "typo", labelled(stages.StageKey, "Ifnra"))},
		wantErr: []string{"ConfigMap/ns/typo", `capstan.dev/stage "Ifnra" names no stage of the plan`, "(stages: Infra, Apps)"},
	},
	{
		name:    "label naming a wait stage is an error",
		specs:   []capstanv1.StageSpec{applyStage("Apply", everything), waitStage("Wait", capstanv1.Selector{})},
		objects: []*unstructured.Unstructured{object("v1", "ConfigMap", "ns", "cm", labelled(stages.StageKey, "Wait"))},
		wantErr: []string{"ConfigMap/ns/cm", `"Wait" is a wait stage, which applies nothing`},
	},
	{
		name:    "duplicate stage names",
		specs:   []capstanv1.StageSpec{applyStage("A", everything), applyStage("B", everything), applyStage("A", everything)},
		wantErr: []string{`stages[2].name: stage "A" is defined twice`},
	},
	{
		name: "invalid labelSelector names the stage field",
		specs: []capstanv1.StageSpec{applyStage("Bad", capstanv1.Selector{LabelSelector: &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}},
		}})},
		wantErr: []string{"stages[0].select.labelSelector:", `"Near" is not a valid label selector operator`},
	},
	{
		name: "readiness checks that do not compile are reported with their stage",
		specs: []capstanv1.StageSpec{
			{Name: "A", Select: everything, ReadyWhen: []capstanv1.ReadinessCheck{{CEL: "true"}, {CEL: "object.status.ready =="}}},
			{Name: "B", Select: everything, ReadyWhen: []capstanv1.ReadinessCheck{{CEL: "object.metadata.name"}, {CEL: "'not a bool'"}}},
		},
		wantErr:  []string{"stages[0].readyWhen[1].cel: ERROR", "stages[1].readyWhen[1].cel: expression returns string, expected bool"},
		wantErrs: 2,
	},
	{
		name: "all stage problems are reported at once",
		specs: []capstanv1.StageSpec{
			applyStage("A", everything),
			applyStage("A", everything),
			applyStage("B", capstanv1.Selector{LabelSelector: &metav1.LabelSelector{
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: metav1.LabelSelectorOpIn}},
			}}),
		},
		wantErr:  []string{`stages[1].name: stage "A" is defined twice`, "stages[2].select.labelSelector:"},
		wantErrs: 2,
	},
	{
		name:  "all object problems are reported at once",
		specs: []capstanv1.StageSpec{applyStage("Config", kinds("ConfigMap"))},
		objects: []*unstructured.Unstructured{
			object("v1", "Secret", "ns", "one"),
			object("v1", "ConfigMap", "ns", "fine"),
			object("v1", "Secret", "ns", "two"),
			object("v1", "ConfigMap", "ns", "typo", labelled(stages.StageKey, "Nope")),
		},
		wantErr:  []string{"Secret/ns/one", "Secret/ns/two", "ConfigMap/ns/typo"},
		wantErrs: 3,
	},
	{
		name: "a scale stage sets one count or the committed ones, not both and not neither",
		specs: []capstanv1.StageSpec{
			applyStage("Config", everything),
			{Name: "None", Action: capstanv1.StageActionScale, Scale: &capstanv1.ScaleSpec{}},
			{Name: "Both", Action: capstanv1.StageActionScale, Scale: &capstanv1.ScaleSpec{Replicas: ptr.To[int32](1), Committed: true}},
			{Name: "Missing", Action: capstanv1.StageActionScale},
			{Name: "Fine", Action: capstanv1.StageActionScale, Scale: &capstanv1.ScaleSpec{Committed: true}},
		},
		wantErr: []string{"stages[1].scale: stage None sets no count", "stages[2].scale: stage Both: scale.committed",
			"stages[3].scale: stage Missing sets no count"},
		wantErrs: 3,
	},
}

func TestBuildPlan(t *testing.T) {
	for _, tc := range planCases {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := stages.BuildPlan(tc.specs, tc.objects)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("BuildPlan succeeded with stages %v, want an error", planRefs(plan))
				}
				if plan != nil {
					t.Errorf("BuildPlan returned a plan with its error")
				}
				for _, want := range tc.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error does not mention %q:\n%v", want, err)
					}
				}
				if got := errorCount(err); tc.wantErrs > 0 && got != tc.wantErrs {
					t.Errorf("error joins %d problems, want %d:\n%v", got, tc.wantErrs, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("BuildPlan: %v", err)
			}
			names := make([]string, len(tc.specs))
			for i, s := range tc.specs {
				names[i] = s.Name
			}
			if !slices.Equal(plan.Names(), names) {
				t.Errorf("plan stages = %v, want %v in the order given", plan.Names(), names)
			}
			got := planRefs(plan)
			for _, name := range names {
				if !slices.Equal(got[name], tc.want[name]) {
					t.Errorf("stage %s holds %v, want %v", name, got[name], tc.want[name])
				}
			}
		})
	}
}

// TestBuildPlanKeepsSpecs checks that the plan carries each stage's spec,
// with the default action filled in, and leaves the caller's specs alone.
func TestBuildPlanKeepsSpecs(t *testing.T) {
	specs := []capstanv1.StageSpec{{
		Name:      "Infra",
		Select:    everything,
		ReadyWhen: []capstanv1.ReadinessCheck{{CEL: "true"}},
	}}
	plan, err := stages.BuildPlan(specs, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := plan.Stages[0]
	if got.Action != capstanv1.StageActionApply {
		t.Errorf("action = %q, want %q", got.Action, capstanv1.StageActionApply)
	}
	if len(got.ReadyWhen) != 1 || got.ReadyWhen[0].CEL != "true" {
		t.Errorf("readyWhen = %v, want the spec's", got.ReadyWhen)
	}
	if specs[0].Action != "" {
		t.Errorf("BuildPlan changed the caller's spec: action = %q", specs[0].Action)
	}
}

func TestKindMatches(t *testing.T) {
	deployment := object("apps/v1", "Deployment", "ns", "web")
	configMap := object("v1", "ConfigMap", "ns", "cm")
	cases := []struct {
		kind string
		obj  *unstructured.Unstructured
		want bool
	}{
		{"*", deployment, true},
		{"Deployment", deployment, true},
		{"apps/Deployment", deployment, true},
		{"extensions/Deployment", deployment, false},
		{"deployment", deployment, false},
		{"ConfigMap", configMap, true},
		{"/ConfigMap", configMap, true},
		{"apps/ConfigMap", configMap, false},
	}
	for _, tc := range cases {
		if got := stages.KindMatches(tc.kind, tc.obj); got != tc.want {
			t.Errorf("KindMatches(%q, %s) = %v, want %v", tc.kind, stages.ObjectRef(tc.obj), got, tc.want)
		}
	}
}

func planRefs(plan *stages.Plan) map[string][]string {
	if plan == nil {
		return nil
	}
	refs := map[string][]string{}
	for _, s := range plan.Stages {
		for _, obj := range s.Objects {
			refs[s.Name] = append(refs[s.Name], stages.ObjectRef(obj))
		}
	}
	return refs
}

// errorCount is how many problems err joins with errors.Join.
func errorCount(err error) int {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		return len(joined.Unwrap())
	}
	if err == nil {
		return 0
	}
	return 1
}

func TestPlanDropLeavesTheRest(t *testing.T) {
	bootstrapOnly := func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{stages.BootstrapOnlyLabel: "true"}) }
	keep := object("v1", "ConfigMap", "ns", "keep", labelled(stages.StageKey, "Apply"))
	drop := object("apps/v1", "Deployment", "ns", "bootstrap-provider", bootstrapOnly, labelled(stages.StageKey, "Apply"))
	plan, err := stages.BuildPlan([]capstanv1.StageSpec{
		{Name: "Apply"},
		{Name: "Scale", Action: capstanv1.StageActionScale, Scale: &capstanv1.ScaleSpec{Replicas: ptr.To[int32](1)}, Select: capstanv1.Selector{Kinds: []string{"apps/Deployment"}}},
		{Name: "Pivot", Action: capstanv1.StageActionPivot},
	}, []*unstructured.Unstructured{keep, drop})
	if err != nil {
		t.Fatal(err)
	}
	plan.Drop(func(u *unstructured.Unstructured) bool { return u.GetLabels()[stages.BootstrapOnlyLabel] == "true" })
	if got := plan.Stages[0].Objects; len(got) != 1 || got[0] != keep {
		t.Errorf("Apply after Drop: %d objects, want only the ConfigMap", len(got))
	}
	if got := plan.Stages[1].Objects; len(got) != 0 {
		t.Errorf("Scale after Drop: %d objects, want none", len(got))
	}
	if got := plan.Stages[2].PlanObjects; len(got) != 1 || got[0] != keep {
		t.Errorf("Pivot's plan objects after Drop: %d, want only the ConfigMap", len(got))
	}
	// The Scale stage is empty because its objects stayed behind, not
	// because its select has a typo: the preflight lets it pass.
	if problems := stages.CheckPlan(plan); len(problems) != 0 {
		t.Errorf("the preflight refuses the plan after Drop: %v", problems)
	}
}

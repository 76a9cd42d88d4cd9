package stages_test

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// preflightStages is the plan the preflight tests share: namespaces and
// definitions first, then everything else.
var preflightStages = []capstanv1.StageSpec{
	{Name: "Base", AllowEmpty: true, Select: capstanv1.Selector{Kinds: []string{"Namespace", "CustomResourceDefinition"}}},
	{Name: "Objects", Select: capstanv1.Selector{Kinds: []string{"*"}}},
}

// reportLines returns the report as its lines, for comparing.
func reportLines(r preflight.Report) []string {
	return strings.Split(strings.TrimSuffix(r.Lines(), "\n"), "\n")
}

// Each row is one mistake a user makes, and the one line preflight must
// report for it; a row without want is a source preflight must pass.
func TestPreflightFindsEachProblemBeforeAnyApply(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stages []capstanv1.StageSpec
		source string
		want   []string
	}{{
		name: "an apiVersion the cluster does not serve names the served versions",
		source: `apiVersion: served.test.capstan.dev/v1alpha1
kind: Gizmo
metadata: {name: ancient, namespace: NS}`,
		want: []string{"ERROR Gizmo NS/ancient: apiVersion: Gizmo is served as served.test.capstan.dev/v1beta2, v1beta1; not v1alpha1; write the object in served.test.capstan.dev/v1beta2"},
	}, {
		name: "a deprecated apiVersion is a warning naming the version to move to",
		source: `apiVersion: served.test.capstan.dev/v1beta1
kind: Gizmo
metadata: {name: old, namespace: NS}`,
		want: []string{"WARNING Gizmo NS/old: apiVersion: served.test.capstan.dev/v1beta1 is deprecated (served.test.capstan.dev/v1beta1 Gizmo is deprecated; use served.test.capstan.dev/v1beta2); write the object in served.test.capstan.dev/v1beta2"},
	}, {
		name: "a namespace nothing creates",
		source: `apiVersion: v1
kind: ConfigMap
metadata: {name: lost, namespace: NS-nowhere}`,
		want: []string{"ERROR ConfigMap NS-nowhere/lost: metadata.namespace: namespace NS-nowhere does not exist and no stage before Objects creates it: add a Namespace object or set `namespace:` in kustomization.yaml"},
	}, {
		name: "a namespaced object without namespace",
		source: `apiVersion: v1
kind: ConfigMap
metadata: {name: homeless}`,
		want: []string{"ERROR ConfigMap homeless: metadata.namespace: ConfigMap is namespaced and the object names no namespace: add a Namespace object or set `namespace:` in kustomization.yaml"},
	}, {
		name: "a namespace an earlier stage creates passes",
		source: `apiVersion: v1
kind: Namespace
metadata: {name: NS-new}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settled, namespace: NS-new}`,
	}, {
		name:   "a namespace a later stage creates is named with its stage",
		stages: []capstanv1.StageSpec{{Name: "Early", Select: capstanv1.Selector{Kinds: []string{"ConfigMap"}}}, {Name: "Late", Select: capstanv1.Selector{Kinds: []string{"Namespace"}}}},
		source: `apiVersion: v1
kind: ConfigMap
metadata: {name: early, namespace: NS-late}
---
apiVersion: v1
kind: Namespace
metadata: {name: NS-late}`,
		want: []string{"ERROR ConfigMap NS-late/early: metadata.namespace: namespace NS-late is created by stage Late, after this object's stage Early: move the Namespace to an earlier stage"},
	}, {
		name: "a kind a CRD of an earlier stage defines passes, in its namespace created first",
		source: `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: sprockets.NS.test.capstan.dev}
spec:
  group: NS.test.capstan.dev
  names: {kind: Sprocket, plural: sprockets, singular: sprocket, listKind: SprocketList}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
---
apiVersion: v1
kind: Namespace
metadata: {name: NS-crd}
---
apiVersion: NS.test.capstan.dev/v1
kind: Sprocket
metadata: {name: first, namespace: NS-crd}`,
	}, {
		name: "an object in a namespace the plan creates is checked against its schema, not dry-run",
		source: `apiVersion: v1
kind: Namespace
metadata: {name: NS-fresh}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: typo, namespace: NS-fresh}
datas: {a: b}`,
		want: []string{"ERROR ConfigMap NS-fresh/typo: datas: schema check: the schema of v1 ConfigMap declares no such field; check its spelling and the apiVersion"},
	}, {
		name: "an object of a kind the plan's CRD defines is checked against that CRD's schema",
		source: `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: cogs.NS.test.capstan.dev}
spec:
  group: NS.test.capstan.dev
  names: {kind: Cog, plural: cogs, singular: cog, listKind: CogList}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                teeth: {type: integer, minimum: 3}
---
apiVersion: NS.test.capstan.dev/v1
kind: Cog
metadata: {name: small, namespace: NS}
spec: {teeth: 2, teath: 2}`,
		want: []string{
			"ERROR Cog NS/small: spec.teath: schema check: the schema of NS.test.capstan.dev/v1 Cog declares no such field",
			"ERROR Cog NS/small: spec.teeth: schema check: does not fit the schema of NS.test.capstan.dev/v1 Cog: should be greater than or equal to 3",
		},
	}, {
		name: "a readiness check that reads its kind in a version the cluster does not serve",
		stages: []capstanv1.StageSpec{{Name: "Objects", Select: capstanv1.Selector{Kinds: []string{"*"}}, ReadyWhen: []capstanv1.ReadinessCheck{{
			Kind: "served.test.capstan.dev/Gizmo", APIVersion: "served.test.capstan.dev/v1alpha1", CEL: "true"}}}},
		source: `apiVersion: served.test.capstan.dev/v1beta2
kind: Gizmo
metadata: {name: current, namespace: NS}`,
		want: []string{"ERROR stage Objects: readyWhen[0].apiVersion: reads Gizmo in served.test.capstan.dev/v1alpha1, which the cluster does not serve (Gizmo is served as served.test.capstan.dev/v1beta2, v1beta1)"},
	}, {
		name: "a field the schema does not declare",
		source: `apiVersion: apps/v1
kind: Deployment
metadata: {name: typo, namespace: NS}
spec:
  replicas: 1
  replicaz: 2
  selector: {matchLabels: {app: typo}}
  template:
    metadata: {labels: {app: typo}}
    spec: {containers: [{name: app, image: example.test/app:1}]}`,
		want: []string{"ERROR Deployment NS/typo: spec.replicaz: the API server refuses the object (dry run): "},
	}, {
		name: "a value the schema refuses",
		source: `apiVersion: test.capstan.dev/v1alpha1
kind: Widget
metadata: {name: tiny, namespace: NS}
spec: {size: 0}`,
		want: []string{"ERROR Widget NS/tiny: spec.size: the API server refuses the object (dry run): "},
	}, {
		name:   "a stage that selects nothing",
		stages: []capstanv1.StageSpec{{Name: "Objects", Select: capstanv1.Selector{Kinds: []string{"*"}}}, {Name: "Workers", Select: capstanv1.Selector{Kinds: []string{"MachineDeployment"}}}},
		source: `apiVersion: v1
kind: ConfigMap
metadata: {name: one, namespace: NS}`,
		want: []string{"ERROR stage Workers: select: selects no object: no rendered object is labelled capstan.dev/stage: Workers and select matches none; fix select or the labels, or set allowEmpty: true on a stage that may be empty"},
	}, {
		name:   "a stage that may be empty says so",
		stages: []capstanv1.StageSpec{{Name: "Objects", Select: capstanv1.Selector{Kinds: []string{"*"}}}, {Name: "Workers", AllowEmpty: true, Select: capstanv1.Selector{Kinds: []string{"MachineDeployment"}}}},
		source: `apiVersion: v1
kind: ConfigMap
metadata: {name: one, namespace: NS}`,
	}, {
		name: "a readiness expression over the cost limit",
		stages: []capstanv1.StageSpec{{Name: "Objects", Select: capstanv1.Selector{Kinds: []string{"*"}}, ReadyWhen: []capstanv1.ReadinessCheck{{
			CEL: "object.data.all(a, object.data.all(b, object.data.all(c, a != b || b != c)))"}}}},
		source: `apiVersion: v1
kind: ConfigMap
metadata: {name: one, namespace: NS}`,
		want: []string{"ERROR stage Objects: readyWhen[0].cel: may cost up to "},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			installGizmos(t)
			ctx := testContext(t)
			c, log := newClient(t)
			specs := tc.stages
			if specs == nil {
				specs = preflightStages
			}
			plan, err := stages.BuildPlan(specs, decodeObjects(t, strings.ReplaceAll(tc.source, "NS", ns)))
			if err != nil {
				t.Fatal(err)
			}
			mark := log.mark()
			report, err := stages.NewExecutor(c).Preflight(ctx, plan, owner, stages.PreflightOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if writes := log.writesSince(mark, false); len(writes) > 0 {
				t.Errorf("preflight changed the cluster: %v", writes)
			}
			got := reportLines(report)
			if len(report.Problems) == 0 {
				got = nil
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d problems, want %d:\n%s", len(got), len(tc.want), report.Lines())
			}
			for i, want := range tc.want {
				if !strings.HasPrefix(got[i], strings.ReplaceAll(want, "NS", ns)) {
					t.Errorf("problem %d:\n got %s\nwant %s...", i, got[i], strings.ReplaceAll(want, "NS", ns))
				}
			}
		})
	}
}

// All problems come in one report, and the file render knew for each
// object is named.
func TestPreflightReportsEveryProblemWithItsFile(t *testing.T) {
	ns := newNamespace(t)
	installGizmos(t)
	objects := decodeObjects(t, strings.ReplaceAll(`apiVersion: served.test.capstan.dev/v1alpha1
kind: Gizmo
metadata: {name: ancient, namespace: NS}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: lost, namespace: NS-nowhere}
---
apiVersion: test.capstan.dev/v1alpha1
kind: Widget
metadata: {name: tiny, namespace: NS}
spec: {size: 0}`, "NS", ns))
	files := map[*unstructured.Unstructured]string{objects[0]: "base/gizmo.yaml", objects[1]: "base/cm.yaml", objects[2]: "base/widget.yaml"}
	plan, err := stages.BuildPlan(append(slices.Clone(preflightStages), capstanv1.StageSpec{Name: "Empty", Select: capstanv1.Selector{Names: []string{"none"}}}), objects)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := newClient(t)
	report, err := stages.NewExecutor(c).Preflight(testContext(t), plan, owner, stages.PreflightOptions{
		File: func(obj *unstructured.Unstructured) string { return files[obj] },
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(report.Errors()); n != 4 {
		t.Fatalf("got %d errors, want 4:\n%s", n, report.Lines())
	}
	for _, file := range []string{"(in base/gizmo.yaml)", "(in base/cm.yaml)", "(in base/widget.yaml)"} {
		if !strings.Contains(report.Lines(), file) {
			t.Errorf("no problem names %s:\n%s", file, report.Lines())
		}
	}
	var perr error = &stages.PreflightError{Report: report}
	if !stages.IsPreflightFailed(perr) || !strings.HasPrefix(perr.Error(), "preflight found 4 errors, 0 warnings; nothing was applied:\n") {
		t.Errorf("PreflightError = %q", perr)
	}
}

// The built-in profiles' readiness expressions stay within the cost
// limit: preflight must not refuse a plan for its own profile.
func TestBuiltInProfilesPassCheckPlan(t *testing.T) {
	for _, name := range stages.Profiles() {
		p, err := stages.LoadProfile(name)
		if err != nil {
			t.Fatal(err)
		}
		plan := &stages.Plan{}
		for _, spec := range p.Stages {
			plan.Stages = append(plan.Stages, stages.Stage{StageSpec: spec, Objects: []*unstructured.Unstructured{{}}})
		}
		if problems := stages.CheckPlan(plan); len(problems) > 0 {
			t.Errorf("profile %s: %v", name, problems)
		}
	}
}

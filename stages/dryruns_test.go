package stages_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/ssa"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// configStage is an apply stage named name of objs.
func configStage(name string, objs []*unstructured.Unstructured) stages.Stage {
	return stages.Stage{StageSpec: capstanv1.StageSpec{Name: name, Action: capstanv1.StageActionApply}, Objects: objs}
}

// preflightKeeping runs the preflight of plan for owner and returns the
// answers it kept.
func preflightKeeping(t *testing.T, e *stages.Executor, plan *stages.Plan, o stages.Owner) *stages.DryRuns {
	t.Helper()
	dry := &stages.DryRuns{}
	report, err := e.Preflight(testContext(t), plan, o, stages.PreflightOptions{Keep: dry})
	if err != nil || report.Err() != nil {
		t.Fatalf("Preflight = %v, %v", report.Problems, err)
	}
	return dry
}

// TestApplyUsesThePreflightsDryRuns: with the preflight's dry-run answers
// at hand, a stage's apply reads the live objects with one LIST and sends
// no dry run: an unchanged object costs nothing, a changed one its apply,
// a new one its apply. An object written since the preflight is dry-run
// again, and restored.
func TestApplyUsesThePreflightsDryRuns(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	e := stages.NewExecutor(c)
	const n = 20
	if _, err := e.Apply(ctx, configMaps(ns, n, "a"), "Config", owner); err != nil {
		t.Fatal(err)
	}

	objs := configMaps(ns, n, "a")
	objs[3] = configMap(ns, "cm-03", map[string]any{"v": "b"})
	for i := range 5 {
		objs = append(objs, configMap(ns, fmt.Sprintf("new-%d", i), map[string]any{"v": "a"}))
	}
	plan := &stages.Plan{Stages: []stages.Stage{configStage("Config", objs)}}
	dry := preflightKeeping(t, e, plan, owner)
	if dry.Len() != n+5 {
		t.Errorf("kept %d answers, want %d: one per object, 5 of them absent", dry.Len(), n+5)
	}

	mark := log.mark()
	res := e.Run(ctx, &plan.Stages[0], owner, stages.RunOptions{DryRuns: dry})
	if res.State != capstanv1.StageReady {
		t.Fatalf("Run = %s: %s", res.State, res.Message)
	}
	got := res.ChangeSet.ToGroupedMap()
	if len(got[ssa.UnchangedAction]) != n-1 || len(got[ssa.ConfiguredAction]) != 1 || len(got[ssa.CreatedAction]) != 5 {
		t.Errorf("change set %v, want %d unchanged, cm-03 configured, 5 created", got, n-1)
	}
	if got, want := countRequests(log.since(mark)), (requestCounts{lists: 1, applies: 6}); got != want {
		t.Errorf("requests %+v, want %+v: no dry run, an apply for the changed and for each new object", got, want)
	}

	// Written by someone else after the preflight: its answer is stale.
	dry = preflightKeeping(t, e, plan, owner)
	edited := getLive(t, c, objs[5])
	edited.Object["data"] = map[string]any{"v": "edited"}
	if err := c.Update(ctx, edited); err != nil {
		t.Fatal(err)
	}
	mark = log.mark()
	res = e.Run(ctx, &plan.Stages[0], owner, stages.RunOptions{DryRuns: dry})
	if res.State != capstanv1.StageReady {
		t.Fatalf("Run after an edit = %s: %s", res.State, res.Message)
	}
	if got := res.ChangeSet.ToGroupedMap()[ssa.ConfiguredAction]; len(got) != 1 || !strings.Contains(got[0], "cm-05") {
		t.Errorf("configured %v, want only cm-05, edited since the preflight", got)
	}
	if got, want := countRequests(log.since(mark)), (requestCounts{lists: 1, dryRuns: 1, applies: 1}); got != want {
		t.Errorf("requests %+v, want %+v: the edited object dry-run again and applied", got, want)
	}
	if v := getLive(t, c, objs[5]).Object["data"].(map[string]any)["v"]; v != "a" {
		t.Errorf("cm-05: v = %v, want a restored", v)
	}
}

// TestApplyWithDryRunsChecksOwnership: an answer stands in for a dry run,
// not for the ownership check: an object another deployment applied is
// refused, and nothing of the wave is written.
func TestApplyWithDryRunsChecksOwnership(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	installDeploymentCRD(t, c)
	e := stages.NewExecutor(c)
	first := stages.Owner{Name: "first", Namespace: ns}
	createDeployment(t, c, first)
	if _, err := e.Apply(ctx, configMaps(ns, 10, "a")[9:], "Config", first); err != nil {
		t.Fatal(err)
	}
	plan := &stages.Plan{Stages: []stages.Stage{configStage("Config", configMaps(ns, 10, "a"))}}
	dry := preflightKeeping(t, e, plan, owner)
	if dry.Len() != 10 {
		t.Fatalf("kept %d answers, want 10 (cm-09 and 9 absent)", dry.Len())
	}

	mark := log.mark()
	res := e.Run(ctx, &plan.Stages[0], owner, stages.RunOptions{DryRuns: dry})
	want := "ConfigMap/" + ns + "/cm-09 belongs to ClusterDeployment " + first.Namespace + "/" + first.Name
	if res.State != capstanv1.StageFailed || !stages.IsStalled(res.Err) || !strings.Contains(res.Message, want) {
		t.Fatalf("Run = %s %q, want a stalled failure with %q", res.State, res.Message, want)
	}
	if writes := log.writesSince(mark, true); len(writes) > 0 {
		t.Errorf("a refused wave sent writes: %v", writes)
	}
}

// TestPreflightKeepsNoAnswersAfterADefinition: a CRD or a webhook
// configuration applied by a stage may change what the server answers for
// the objects after it, so the answers of that stage and the later ones
// are not kept.
func TestPreflightKeepsNoAnswersAfterADefinition(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, _ := newClient(t)
	installDeploymentCRD(t, c)
	e := stages.NewExecutor(c)
	if _, err := e.Apply(ctx, configMaps(ns, 6, "a"), "Config", owner); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("../manifests/crds/capstan.dev_clusterdeployments.yaml")
	if err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &crd.Object); err != nil {
		t.Fatal(err)
	}
	objs := configMaps(ns, 6, "a")
	plan := &stages.Plan{Stages: []stages.Stage{
		configStage("Early", objs[:2]),
		configStage("Definitions", []*unstructured.Unstructured{crd, objs[2]}),
		configStage("Late", objs[3:]),
	}}
	dry := preflightKeeping(t, e, plan, owner)
	if dry.Len() != 2 {
		t.Errorf("kept %d answers, want 2: those of the stage before the CRD's", dry.Len())
	}
}

// TestApplyCreatesWhatThePreflightFoundAbsent: in a namespace that holds
// many objects of the kind (a fleet of deployments), a stage of new
// objects costs its applies alone once the preflight found them absent:
// no LIST and no GET per object, which the look needs without the
// answers. An object another writer created since, with other values,
// is not taken over silently: its create conflicts, and it is looked at
// as one that existed.
func TestApplyCreatesWhatThePreflightFoundAbsent(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	e := stages.NewExecutor(c)
	others := stages.Owner{Name: "others", Namespace: ns}
	var many []*unstructured.Unstructured
	for i := range 300 {
		many = append(many, configMap(ns, fmt.Sprintf("other-%03d", i), map[string]any{"v": "o"}))
	}
	if _, err := e.Apply(ctx, many, "Config", others); err != nil {
		t.Fatal(err)
	}
	const n = 20
	plan := &stages.Plan{Stages: []stages.Stage{configStage("Config", configMaps(ns, n, "a"))}}

	// Without the answers: the LIST's first page misses them, a GET each.
	mark := log.mark()
	if res := e.Run(ctx, &plan.Stages[0], owner, stages.RunOptions{}); res.State != capstanv1.StageReady {
		t.Fatalf("Run = %s: %s", res.State, res.Message)
	}
	if got := countRequests(log.since(mark)); got.gets+got.lists <= n/2 {
		t.Fatalf("requests %+v: the look without answers read the objects with fewer requests than expected; the test no longer shows the cost", got)
	}

	fresh := configMaps(ns, n, "b")
	for _, obj := range fresh {
		obj.SetName("new-" + obj.GetName())
	}
	plan = &stages.Plan{Stages: []stages.Stage{configStage("Config", fresh)}}
	dry := preflightKeeping(t, e, plan, owner)
	if dry.Len() != n {
		t.Errorf("kept %d answers, want %d: one per object, each absent", dry.Len(), n)
	}
	mark = log.mark()
	res := e.Run(ctx, &plan.Stages[0], owner, stages.RunOptions{DryRuns: dry})
	if res.State != capstanv1.StageReady {
		t.Fatalf("Run = %s: %s", res.State, res.Message)
	}
	if got, want := countRequests(log.since(mark)), (requestCounts{applies: n}); got != want {
		t.Errorf("requests %+v, want %+v: an apply per new object, no look", got, want)
	}
	if got := res.ChangeSet.ToGroupedMap()[ssa.CreatedAction]; len(got) != n {
		t.Errorf("created %d, want %d", len(got), n)
	}

	// Created by someone else between the preflight and the apply, with
	// other values: the apply does not take it over unseen, but refuses
	// it as any object found that Capstan did not apply.
	late := configMaps(ns, 3, "c")
	for _, obj := range late {
		obj.SetName("late-" + obj.GetName())
	}
	plan = &stages.Plan{Stages: []stages.Stage{configStage("Config", late)}}
	dry = preflightKeeping(t, e, plan, owner)
	intruder := late[1].DeepCopy()
	intruder.Object["data"] = map[string]any{"v": "theirs"}
	if err := c.Patch(ctx, intruder, client.Apply, client.FieldOwner("someone-else")); err != nil {
		t.Fatal(err)
	}
	res = e.Run(ctx, &plan.Stages[0], owner, stages.RunOptions{DryRuns: dry})
	if res.State != capstanv1.StageFailed || !strings.Contains(res.Message, "late-cm-01 exists, was not applied by Capstan") {
		t.Fatalf("Run = %s %q, want late-cm-01 refused: created meanwhile by someone else", res.State, res.Message)
	}
	if v := getLive(t, c, late[1]).Object["data"].(map[string]any)["v"]; v != "theirs" {
		t.Errorf("late-cm-01: v = %v, want theirs: left as its writer made it", v)
	}
}

// TestPreflightRemembersTheNamespacesItFound: deployments in one
// namespace (a fleet) have it looked up once, not once each, by the
// executor and by those As makes for their ServiceAccounts; a namespace
// that does not exist is asked again (and named), since only "it exists"
// is remembered.
func TestPreflightRemembersTheNamespacesItFound(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	e := stages.NewExecutor(c)
	nsPath := "/api/v1/namespaces/" + ns
	lookups := func(mark int, path string) int {
		n := 0
		for _, r := range log.since(mark) {
			if r.method == "GET" && r.path == path {
				n++
			}
		}
		return n
	}
	mark := log.mark()
	for i := range 3 {
		plan := &stages.Plan{Stages: []stages.Stage{configStage("Config", configMaps(ns, 2, fmt.Sprint(i)))}}
		ex := e
		if i == 2 {
			ex = e.As(c, ns+"/deployer")
		}
		if report, err := ex.Preflight(ctx, plan, owner, stages.PreflightOptions{}); err != nil || report.Err() != nil {
			t.Fatalf("Preflight = %v, %v", report.Problems, err)
		}
	}
	if got := lookups(mark, nsPath); got != 1 {
		t.Errorf("namespace %s looked up %d times by three preflights, want 1", ns, got)
	}

	missing := ns + "-missing"
	mark = log.mark()
	for range 2 {
		objs := configMaps(missing, 1, "a")
		plan := &stages.Plan{Stages: []stages.Stage{configStage("Config", objs)}}
		report, err := e.Preflight(ctx, plan, owner, stages.PreflightOptions{})
		if err != nil || report.Err() == nil || !strings.Contains(report.Err().Error(), missing) {
			t.Fatalf("Preflight in a missing namespace = %v, %v; want a problem naming %s", report.Problems, err, missing)
		}
	}
	if got := lookups(mark, "/api/v1/namespaces/"+missing); got != 2 {
		t.Errorf("missing namespace looked up %d times by two preflights, want 2: absence is not remembered", got)
	}
}

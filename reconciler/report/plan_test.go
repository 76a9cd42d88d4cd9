package report

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/reconciler/report/forge"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/stages"
)

var updatePlan = flag.Bool("update-plan", false, "rewrite testdata/plan/*.md")

// planFixture reads a plan diff as `capstan diff -o json` prints it.
// testdata/plan/shop.json is that output for cmd/capstan/testdata/diff
// v2 against v1 applied to a real API server (cmd/capstan TestDiffCommand).
func planFixture(t *testing.T, file string) *stages.PlanDiff {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "plan", file))
	if err != nil {
		t.Fatal(err)
	}
	var report struct {
		Diff *stages.PlanDiff `json:"diff"`
	}
	if err := json.Unmarshal(data, &report); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return report.Diff
}

func goldenPlan(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "plan", name)
	if *updatePlan {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./reconciler/report -run TestRenderPlanComment -update-plan to create it)", err)
	}
	if got != string(want) {
		t.Errorf("comment differs from %s (run with -update-plan after checking):\n%s", path, got)
	}
}

// lcmUpgrade is the diff of a new LCM release, as stages'
// TestDiffPlanLCMUpgradeBatches finds it on a real API server.
func lcmUpgrade() *stages.PlanDiff {
	batch := func(stage, phase, typ string, drain bool, machines ...string) stages.RolloutBatch {
		return stages.RolloutBatch{Stage: stage, Phase: phase, Type: typ, Machines: machines, Drain: drain}
	}
	rollout := stages.RolloutDiff{
		Object:   "LCMCluster/east/east",
		Changes:  []string{"release: r-1 -> r-2", "machineTypes.manager: new StateItems", "machineTypes.worker: new StateItems"},
		Strategy: "prepare on every machine at once, then managers one at a time, then workers at most 2 at once (spec.rollout.workerBatchSize); a deployed worker is cordoned and drained (PodDisruptionBudgets honoured) before its upgrade",
		Batches: []stages.RolloutBatch{
			batch("MachinesPrepared", "prepare", "", false, "m-0", "m-1", "w-0", "w-1", "w-2", "w-3"),
			batch("ManagersDeployed", "deploy", "manager", false, "m-0"),
			batch("ManagersDeployed", "deploy", "manager", false, "m-1"),
			batch("FirstWorkerDeployed", "deploy", "worker", true, "w-0"),
			batch("WorkersDeployed", "deploy", "worker", true, "w-1", "w-2"),
			batch("WorkersDeployed", "deploy", "worker", true, "w-3"),
		},
	}
	changed := stages.ObjectDiff{Ref: "LCMCluster/east/east", APIVersion: "lcm.capstan.dev/v1alpha1", Kind: "LCMCluster", Namespace: "east", Name: "east", Action: stages.DiffChange,
		Fields: []stages.FieldDiff{
			{Path: "spec.machineTypes.manager[name=download].version", Op: stages.FieldChanged, Old: `"1"`, New: `"2"`},
			{Path: "spec.machineTypes.manager[name=join-manager].version", Op: stages.FieldChanged, Old: `"1"`, New: `"2"`},
			{Path: "spec.machineTypes.worker[name=download].version", Op: stages.FieldChanged, Old: `"1"`, New: `"2"`},
			{Path: "spec.machineTypes.worker[name=join-worker].version", Op: stages.FieldChanged, Old: `"1"`, New: `"2"`},
			{Path: "spec.release", Op: stages.FieldChanged, Old: "r-1", New: "r-2"},
		}}
	rolloutStage := func(name string, machines int) stages.StageDiff {
		why := fmt.Sprintf("hand new items to %d machines", machines)
		if machines == 1 {
			why = "hand new items to 1 machine"
		}
		return stages.StageDiff{Name: name, Action: "rollout", Works: true, Runs: true, Why: why}
	}
	return &stages.PlanDiff{NewRevision: true, Stages: []stages.StageDiff{
		{Name: "LCMObjectsCreated", Action: "apply", Works: true, Runs: true, Why: "change 1", Objects: []stages.ObjectDiff{changed}, Rollouts: []stages.RolloutDiff{rollout}},
		rolloutStage("MachinesPrepared", 6),
		rolloutStage("ManagersDeployed", 2),
		rolloutStage("FirstWorkerDeployed", 1),
		{Name: "HelmControllerInstalled", Action: "apply", Runs: true, Why: "re-checked at the new revision; nothing to do"},
		rolloutStage("WorkersDeployed", 3),
	}}
}

// The marker is the one the forges find their comment by.
func TestPlanMarkerIsTheForgesMarker(t *testing.T) {
	if got := forge.Marker(PlanMarkerKey); got != PlanMarker {
		t.Errorf("forge.Marker(%q) = %q, PlanMarker = %q", PlanMarkerKey, got, PlanMarker)
	}
}

// plantedValue is a Secret value that must never reach a comment.
const plantedValue = "planted-comment-secret-e41d"

func TestRenderPlanComment(t *testing.T) {
	shop := planFixture(t, "shop.json")
	renderErr := errors.Join(
		&render.Error{File: "clusters/edge/network.yaml", Object: "ConfigMap/capstan-system/network", Field: "data.podCIDR", Err: errors.New(`"10.0.0.0/33" is not a CIDR`)},
		&render.Error{File: "clusters/edge/kustomization.yaml", Field: "resources[2]", Err: errors.New("hosts.yaml: file does not exist")},
	)
	for _, tc := range []struct {
		name   string
		in     PlanCommentInput
		golden string
	}{
		{
			name: "a revision that changes one deployment and breaks another",
			in: PlanCommentInput{Revision: "pr-7@sha1:5b0c1e2f", PRNumber: 7, Deployments: []PlanCommentDeployment{
				{Name: "shop", Namespace: "capstan-system", Diff: shop},
				{Name: "edge", Namespace: "capstan-system", Err: renderErr},
				{Name: "lcm-east", Namespace: "capstan-system", Diff: lcmUpgrade()},
			}},
			golden: "shop.md",
		},
		{
			name:   "a revision that changes no deployment",
			in:     PlanCommentInput{Revision: "pr-8@sha1:0a0a0a0a"},
			golden: "empty.md",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := RenderPlanComment(tc.in)
			if !strings.HasPrefix(got, PlanMarker+"\n") {
				t.Errorf("comment does not begin with the marker line %q", PlanMarker)
			}
			goldenPlan(t, tc.golden, got)
		})
	}
}

// Every value of the Secrets given is scrubbed, wherever it turns up: in
// an error, in a field diff of another kind of object.
func TestRenderPlanCommentScrubsSecretValues(t *testing.T) {
	d := &stages.PlanDiff{Stages: []stages.StageDiff{{
		Name: "Config", Action: "apply", Works: true, Runs: true, Why: "change 1",
		Objects: []stages.ObjectDiff{
			{Ref: "ConfigMap/ns/copy", Kind: "ConfigMap", Action: stages.DiffChange, Fields: []stages.FieldDiff{
				{Path: "data.token", Op: stages.FieldChanged, Old: "old", New: plantedValue},
			}},
			{Ref: "Widget/ns/w", Kind: "Widget", Action: stages.DiffInvalid, Error: "spec.key: Invalid value: \"" + plantedValue + "\""},
		},
	}}}
	got := RenderPlanComment(PlanCommentInput{
		Revision:    "main@sha1:1",
		Deployments: []PlanCommentDeployment{{Name: "a", Namespace: "ns", Diff: d, Err: errors.New("render: " + plantedValue)}},
		Secrets:     []map[string][]byte{{"token": []byte(plantedValue)}},
	})
	if strings.Contains(got, plantedValue) {
		t.Errorf("comment holds the Secret value:\n%s", got)
	}
	if !strings.Contains(got, "data.token: old -> ***") {
		t.Errorf("comment lacks the scrubbed field diff:\n%s", got)
	}
}

// A plan too long for one comment drops the object lists, not the
// summary.
func TestRenderPlanCommentTooLong(t *testing.T) {
	d := &stages.PlanDiff{Stages: []stages.StageDiff{{Name: "Big", Action: "apply", Works: true, Runs: true, Why: "create 3000"}}}
	for i := range 3000 {
		d.Stages[0].Objects = append(d.Stages[0].Objects, stages.ObjectDiff{Ref: "ConfigMap/ns/" + strings.Repeat("x", 40) + string(rune('a'+i%26)), Action: stages.DiffCreate})
	}
	var deployments []PlanCommentDeployment
	for _, name := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		deployments = append(deployments, PlanCommentDeployment{Name: name, Namespace: "ns", Diff: d})
	}
	got := RenderPlanComment(PlanCommentInput{Revision: "r", Deployments: deployments})
	if len(got) > maxCommentLen {
		t.Errorf("comment is %d bytes, more than %d", len(got), maxCommentLen)
	}
	if !strings.Contains(got, "`ns/j`: 3000 create") || !strings.Contains(got, "do not fit in one comment") {
		t.Errorf("summary of the last deployment or the note is missing:\n%.2000s", got)
	}
}

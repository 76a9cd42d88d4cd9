package stages_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/stages"
)

// A diff without values keeps what changes and drops what it holds: each
// field's path and op, each rollout's fields and batches, the problems'
// errors; no old or new value and no strategy sentence (its counts are
// values). The diff it came from is left as it was.
func TestPlanDiffWithoutValues(t *testing.T) {
	live := "https://db-7f3a.internal.corp.example:5432"
	d := &stages.PlanDiff{
		Stages: []stages.StageDiff{{
			Name: "Workers",
			Objects: []stages.ObjectDiff{
				{Ref: "ConfigMap/ns/app", Action: stages.DiffChange, Fields: []stages.FieldDiff{
					{Path: "data.endpoint", Op: stages.FieldChanged, Old: live, New: "https://new:5432"},
					{Path: "data.added", Op: stages.FieldAdded, New: "x"},
					{Path: "data.gone", Op: stages.FieldRemoved, Old: live},
				}},
				{Ref: "Widget/ns/w", Action: stages.DiffInvalid, Error: "spec.size: Invalid value: 7"},
			},
			Rollouts: []stages.RolloutDiff{{
				Object:   "MachineDeployment/ns/workers",
				Changes:  []string{"version: v1.34.1 -> v1.35.4", "replicas: 2 -> 3"},
				Strategy: "rolling update of 3 machines",
				Batches:  []stages.RolloutBatch{{Stage: "Deploy", Phase: "deploy", Machines: []string{"w-0"}}},
			}, {Object: "LCMCluster/ns/c", Changes: []string{"new LCMCluster, release 2.1"}}},
		}},
		Prune: []stages.ObjectDiff{{Ref: "ConfigMap/ns/old", Action: stages.DiffDelete}},
	}
	before := render(d)
	hidden := d.WithoutValues()
	got := render(hidden)
	want := []string{
		"ConfigMap/ns/app change",
		"  data.endpoint: (changed)",
		"  data.added: (added)",
		"  data.gone: (removed)",
		"Widget/ns/w invalid spec.size: Invalid value: 7",
		"rollout MachineDeployment/ns/workers: version: (changed), replicas: (changed) [] 1 batches",
		"rollout LCMCluster/ns/c: new LCMCluster [] 0 batches",
		"prune ConfigMap/ns/old delete",
	}
	if !slices.Equal(got, want) {
		t.Errorf("without values:\n got %q\nwant %q", got, want)
	}
	if after := render(d); !slices.Equal(after, before) {
		t.Errorf("the diff changed:\n got %q\nwant %q", after, before)
	}
	for _, line := range got {
		if strings.Contains(line, "corp.example") || strings.Contains(line, "v1.35") {
			t.Errorf("a value is left: %q", line)
		}
	}
}

func render(d *stages.PlanDiff) []string {
	var out []string
	for _, s := range d.Stages {
		for _, o := range s.Objects {
			out = append(out, strings.TrimSpace(o.Ref+" "+string(o.Action)+" "+o.Error))
			for _, f := range o.Fields {
				out = append(out, "  "+f.String())
			}
		}
		for _, r := range s.Rollouts {
			out = append(out, fmt.Sprintf("rollout %s: %s [%s] %d batches", r.Object, strings.Join(r.Changes, ", "), r.Strategy, len(r.Batches)))
		}
	}
	for _, o := range d.Prune {
		out = append(out, "prune "+o.Ref+" "+string(o.Action))
	}
	return out
}

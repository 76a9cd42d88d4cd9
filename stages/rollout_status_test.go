package stages

import (
	"testing"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
)

// TestRolloutProgressCounts pins the counts a rollout stage reports in
// status.stages[].progress: its machines done of all it covers.
func TestRolloutProgressCounts(t *testing.T) {
	upgrading := func(i int, m *rolloutMachine) {
		readyAtV1(i, m)
		if i < 3 { // three workers took the new release and finished it
			m.given(desiredItems(v2, m.Spec.Type)).finished()
		}
	}
	for _, tc := range []struct {
		name     string
		clusters []rolloutCluster
		settings rolloutSettings
		want     string // "" for no progress
	}{
		{"workers upgraded so far, of all", []rolloutCluster{clusterOf(v2, fleet(lcmv1.MachineTypeWorker, 5, upgrading))}, deployWorkers, "3/5 workers ready"},
		{"managers only, none started", []rolloutCluster{clusterOf(v1, fleet(lcmv1.MachineTypeManager, 3, prepared), fleet(lcmv1.MachineTypeWorker, 4, prepared))}, deployManagers, "0/3 managers ready"},
		{"every type, every cluster", []rolloutCluster{
			clusterOf(v1, fleet(lcmv1.MachineTypeManager, 1, readyAtV1), fleet(lcmv1.MachineTypeWorker, 2, prepared)),
			clusterOf(v1, fleet(lcmv1.MachineTypeWorker, 3, readyAtV1)),
		}, deployAll, "4/6 machines ready"},
		{"prepare", []rolloutCluster{clusterOf(v1, fleet(lcmv1.MachineTypeManager, 2, prepared), fleet(lcmv1.MachineTypeWorker, 2, nil))}, prepareAll, "2/4 machines prepared"},
		{"a limit counts the workers it takes", []rolloutCluster{clusterOf(v1, fleet(lcmv1.MachineTypeWorker, 40, prepared))}, firstWorker, "0/1 workers ready"},
		{"machines of a missing LCMCluster are not done", []rolloutCluster{{Namespace: "ns", Name: "east", Machines: clusterOf(v1, fleet(lcmv1.MachineTypeWorker, 2, readyAtV1)).Machines}}, deployWorkers, "0/2 workers ready"},
		{"no machines, no progress", []rolloutCluster{clusterOf(v1)}, deployAll, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rolloutProgress(tc.clusters, tc.settings).String(); got != tc.want {
				t.Errorf("progress = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRolloutProgressFollowsTheWalk plays an upgrade of 3 managers and 20
// workers turn by turn, as TestRolloutWalk does: the count never goes
// back, and it reaches its total exactly when the stage is done.
func TestRolloutProgressFollowsTheWalk(t *testing.T) {
	machines := append(fleet(lcmv1.MachineTypeManager, 3, readyAtV1), fleet(lcmv1.MachineTypeWorker, 20, readyAtV1)...)
	s := rolloutSettings{phase: lcmv1.StatePhaseDeploy, batch: 4}
	last := int32(-1)
	for turn := 0; turn < 1000; turn++ {
		c := clusterOf(v2, machines)
		p := rolloutProgress([]rolloutCluster{c}, s)
		if p.Total != 23 || p.Done < last || p.Done > p.Total {
			t.Fatalf("turn %d: progress %s after %d done", turn, p, last)
		}
		last = p.Done
		step := planRollout(c, s)
		if step.Done {
			if p.Done != p.Total {
				t.Fatalf("stage done at %s", p)
			}
			return
		}
		if p.Done == p.Total && len(step.Release) == 0 {
			t.Fatalf("turn %d: %s but the stage is not done: %v", turn, p, step.Waiting)
		}
		byName := map[string]*rolloutMachine{}
		for _, m := range machines {
			byName[m.Name] = m
		}
		for _, m := range step.Release {
			byName[m.Name].DrainMark = ""
		}
		for _, h := range step.HandOuts {
			m := byName[h.Machine.Name]
			if h.Drain {
				m.DrainMark = drainMarkCordoned
			}
			m.given(h.Items)
		}
		for _, m := range machines {
			if !settled(m.LCMMachine) {
				m.finished()
			}
		}
	}
	t.Fatal("the upgrade did not finish in 1000 turns")
}

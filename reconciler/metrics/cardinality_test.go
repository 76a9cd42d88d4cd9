package metrics_test

import (
	"fmt"
	"testing"
	"time"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
)

// seriesBound is the bound docs/metrics.md states. Per ClusterDeployment:
// 6 series per stage (4 stage_state, started, stuck) and at most 10 more
// (consecutive failures, last success, interval, revision info, and
// apply_objects_total for at most 6 actions). The histograms aggregate over
// deployments: 15 series (12 buckets, +Inf, sum, count) per stage name and
// result (2), per reconcile result (3), per source operation and result (4).
func seriesBound(deployments, stagesPer, stageNames int) int {
	const histogram = 15
	return deployments*(6*stagesPer+10) + histogram*(2*stageNames+3+4)
}

// bootstrapStages are seed 000's 15 states (DESIGN.md), the stage names
// of the bootstrap profile but its 16th (HelmControllerEnabledAfterConfig):
// a plan of the size Capstan ships.
var bootstrapStages = []string{
	"ProxySettingsHandled", "ClusterSSHConfigured", "ProviderUpdatedInBootstrap", "ProviderEnabledInBootstrap",
	"NodesReady", "ObjectsCreated", "ProviderConfigured", "HelmBundleReady", "ControllersDisabledBeforePivot",
	"PivotDone", "ControllersEnabledAfterPivot", "MachinesLCMAgentUpdated", "HelmControllerDisabledBeforeConfig",
	"HelmControllerConfigUpdated", "ClusterReady",
}

// statedLimit is the round figure docs/metrics.md gives for 200
// deployments of 15 stages.
const statedLimit = 21000

// 200 ClusterDeployments on the 15-stage bootstrap plan, walked through
// three revisions with every stage state, stay under the stated bound, and
// forgetting them leaves only the aggregated histograms.
func TestCardinalityOf200DeploymentsOf15Stages(t *testing.T) {
	const n = 200
	bound := seriesBound(n, len(bootstrapStages), len(bootstrapStages))
	if bound > statedLimit {
		t.Fatalf("the formula gives %d series, over the stated %d", bound, statedLimit)
	}
	c, reg := newCollector(t)

	deployments := make([]*capstanv1.ClusterDeployment, n)
	for i := range deployments {
		deployments[i] = deployment(fmt.Sprintf("ns-%d", i%10), fmt.Sprintf("cluster-%03d", i))
	}
	// Round r: deployment i has its first (i+r)%16 stages Ready, the next
	// InProgress (stuck for every third), or Failed for every seventh, the
	// rest Pending; each round is a new revision.
	for round := range 3 {
		for i, cd := range deployments {
			cd.Status.Stages = cd.Status.Stages[:0]
			done := (i + round*5) % 16
			for j, name := range bootstrapStages {
				st := capstanv1.StageStatus{Name: name, State: capstanv1.StagePending}
				switch {
				case j < done:
					st.State, st.StartedAt = capstanv1.StageReady, started(time.Hour)
				case j == done && i%7 == 0:
					st.State, st.StartedAt = capstanv1.StageFailed, started(time.Minute)
				case j == done:
					st.State, st.StartedAt, st.Stuck = capstanv1.StageInProgress, started(time.Minute), i%3 == 0
				}
				cd.Status.Stages = append(cd.Status.Stages, st)
			}
			feed(c, cd, fmt.Sprintf("main@sha1:%040d", round))
		}
		got := len(gather(t, reg))
		t.Logf("round %d: %d series (bound %d)", round, got, bound)
		if got > bound {
			t.Fatalf("round %d: %d series, over the bound of %d", round, got, bound)
		}
	}
	all := gather(t, reg)
	if revs := len(find(all, metrics.SourceRevisionInfo, nil)); revs != n {
		t.Errorf("%d source_revision_info series after three revisions, want one per deployment (%d)", revs, n)
	}
	for _, cd := range deployments {
		c.Forget(cd.Namespace, cd.Name)
	}
	left := gather(t, reg)
	for _, s := range left {
		if s.labels["cluster"] != "" {
			t.Fatalf("after forgetting every deployment: %s", s)
		}
	}
	if max := seriesBound(0, 0, len(bootstrapStages)); len(left) > max {
		t.Errorf("after forgetting every deployment: %d series, want at most the %d of the histograms", len(left), max)
	}
}

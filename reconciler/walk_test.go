package reconciler

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// The wait of an attempt ends when the stage passes its stuckAfter, so that
// status and the stuck metric flip then, not up to a wait slice later.
func TestWaitSliceEndsWhenTheStageBecomesStuck(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	r := &Reconciler{opts: ReconcilerOptions{WaitSlice: 30 * time.Second, Now: func() time.Time { return now }}}
	startedAgo := func(d time.Duration) *metav1.Time { t := metav1.NewTime(now.Add(-d)); return &t }
	stuckAfter := &metav1.Duration{Duration: time.Minute}
	for _, tc := range []struct {
		name       string
		stuckAfter *metav1.Duration
		status     capstanv1.StageStatus
		want       time.Duration
	}{
		{"no stuckAfter: the whole slice", nil, capstanv1.StageStatus{StartedAt: startedAgo(50 * time.Second)}, 30 * time.Second},
		{"threshold beyond the slice: the whole slice", stuckAfter, capstanv1.StageStatus{StartedAt: startedAgo(10 * time.Second)}, 30 * time.Second},
		{"threshold within the slice: until just past it", stuckAfter, capstanv1.StageStatus{StartedAt: startedAgo(50 * time.Second)}, 10*time.Second + time.Millisecond},
		{"threshold in a moment: at least a second", stuckAfter, capstanv1.StageStatus{StartedAt: startedAgo(time.Minute - time.Millisecond)}, minWaitSlice},
		{"already stuck: the whole slice", stuckAfter, capstanv1.StageStatus{StartedAt: startedAgo(2 * time.Minute), Stuck: true}, 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stage := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Infra", StuckAfter: tc.stuckAfter}}
			if got := r.waitSlice(stage, &tc.status); got != tc.want {
				t.Errorf("waitSlice = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestMovedCoversMovesByHand(t *testing.T) {
	mirror := func(stage string, phase capstanv1.PivotPhase) *capstanv1.ClusterDeployment {
		cd := &capstanv1.ClusterDeployment{}
		cd.Annotations = map[string]string{pivot.MirrorAnnotation: "target"}
		cd.Status.Pivot = &capstanv1.PivotStatus{Stage: stage, Phase: phase}
		return cd
	}
	for i, tc := range []struct {
		cd   *capstanv1.ClusterDeployment
		want bool
	}{
		{mirror("PivotDone", capstanv1.PivotCleanedUp), true},
		{mirror("PivotDone", capstanv1.PivotSourceCleaned), false}, // the stage still hands over
		{mirror("", capstanv1.PivotSourceCleaned), true},           // by hand: done once the source is clean
		{mirror("", capstanv1.PivotCopied), false},
		{&capstanv1.ClusterDeployment{}, false},
	} {
		if got := moved(tc.cd); got != tc.want {
			t.Errorf("case %d: moved(%+v) = %v, want %v", i, tc.cd.Status.Pivot, got, tc.want)
		}
	}
}

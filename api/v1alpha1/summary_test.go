package v1alpha1

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestStagesCurrent(t *testing.T) {
	const good, bad = "main@sha1:1111111111111111111111111111111111111111", "main@sha1:2222222222222222222222222222222222222222"
	walked := []StageStatus{{Name: "A", State: StageReady, Revision: good}, {Name: "B", State: StageReady, Revision: good}}
	ready := func(status metav1.ConditionStatus, reason string) []metav1.Condition {
		return []metav1.Condition{{Type: ConditionReady, Status: status, Reason: reason}}
	}
	for _, tc := range []struct {
		name   string
		status ClusterDeploymentStatus
		want   bool
	}{
		{"the stages of the revision", ClusterDeploymentStatus{Revision: good, Stages: walked, Conditions: ready("True", "Succeeded")}, true},
		{"a stage failed at this revision", ClusterDeploymentStatus{Revision: good, Stages: walked, Conditions: ready("False", "StageFailed")}, true},
		{"a new revision that did not render", ClusterDeploymentStatus{Revision: bad, Stages: walked, Conditions: ready("False", "RenderFailed")}, false},
		{"a new revision whose stages are not recorded yet", ClusterDeploymentStatus{Revision: bad, Stages: walked}, false},
		{"a new spec at the same revision that preflight stopped", ClusterDeploymentStatus{Revision: good, Stages: walked, Conditions: ready("False", "PreflightFailed")}, false},
		{"a source failure", ClusterDeploymentStatus{Revision: good, Stages: walked, Conditions: ready("False", "SourceUnavailable")}, false},
		{"no stages", ClusterDeploymentStatus{}, true},
	} {
		if got := tc.status.StagesCurrent(); got != tc.want {
			t.Errorf("%s: StagesCurrent = %t, want %t", tc.name, got, tc.want)
		}
	}
}

func TestSummaryMessageIsOneShortLine(t *testing.T) {
	report := "preflight found 2 errors; nothing was applied:\nERROR a: b\nERROR c:\td" + strings.Repeat(" x", 300)
	s := (&ClusterDeploymentStatus{Conditions: []metav1.Condition{{Type: ConditionReady, Status: "False", Message: report}}}).Summarize()
	if !strings.HasPrefix(s.Message, "preflight found 2 errors; nothing was applied: ERROR a: b; ERROR c: d x x") ||
		len([]rune(s.Message)) != maxSummaryMessage || !strings.HasSuffix(s.Message, "…") {
		t.Errorf("summary message = %q (%d runes), want one line cut to %d", s.Message, len([]rune(s.Message)), maxSummaryMessage)
	}
	if s.Stage != "-" || s.Revision != "" {
		t.Errorf("summary of an empty status = %+v, want stage - and no revision", s)
	}
}

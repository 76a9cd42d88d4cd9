package report

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
)

// rolloutAt returns a deployment at revision main@sha1:<sha> whose stages
// and conditions are given.
func rolloutAt(stages []capstanv1.StageStatus, conds ...metav1.Condition) *capstanv1.ClusterDeployment {
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: "fleet"}}
	cd.Status.Revision = "main@sha1:2d8e8f734311d9210a915121c696bc5cbf1eb515"
	cd.Status.Stages = stages
	cd.Status.Conditions = conds
	for _, s := range stages {
		if s.State == capstanv1.StageInProgress || s.State == capstanv1.StageFailed {
			cd.Status.CurrentStage = s.Name
		}
	}
	return cd
}

func second(sec int) *metav1.Time {
	return &metav1.Time{Time: time.Date(2026, 5, 1, 10, 0, sec, 0, time.UTC)}
}

// The commit status follows the rollout: pending while stages walk (a
// failed attempt is retried, so still pending), success when Ready,
// failure when stalled or a stage is stuck, with the stage's message.
func TestCommitStateFollowsTheRollout(t *testing.T) {
	ready := capstanv1.StageStatus{Name: "Config", State: capstanv1.StageReady, StartedAt: second(0), FinishedAt: second(2)}
	for _, tc := range []struct {
		name      string
		cd        *capstanv1.ClusterDeployment
		state     forge.State
		desc      string
		tableLine string
	}{
		{"a stage waiting is pending, with its message",
			rolloutAt([]capstanv1.StageStatus{ready, {Name: "Workers", State: capstanv1.StageInProgress, StartedAt: second(2), Message: "waiting for\nthe workers"}}),
			forge.StatePending, "stage Workers InProgress: waiting for the workers", "| `Workers` | InProgress | 10:00:02Z | running | waiting for the workers |"},
		{"a stage rolling out machines counts them",
			rolloutAt([]capstanv1.StageStatus{ready, {Name: "ControlPlane", State: capstanv1.StageInProgress, StartedAt: second(2),
				Progress: &capstanv1.StageProgress{Done: 3, Total: 5, Unit: "machines up to date"}, Message: "waiting for KubeadmControlPlane/fleet/edge"}}),
			forge.StatePending, "stage ControlPlane InProgress (3/5 machines up to date): waiting for KubeadmControlPlane/fleet/edge",
			"| `ControlPlane` | InProgress, 3/5 machines up to date | 10:00:02Z | running | waiting for KubeadmControlPlane/fleet/edge |"},
		{"a failed attempt is retried: pending",
			rolloutAt([]capstanv1.StageStatus{ready, {Name: "Workers", State: capstanv1.StageFailed, StartedAt: second(2), Message: "apply: conflict"}}),
			forge.StatePending, "stage Workers Failed: apply: conflict", "| `Workers` | Failed | 10:00:02Z | running | apply: conflict |"},
		{"a stuck stage fails the status with its message",
			rolloutAt([]capstanv1.StageStatus{ready, {Name: "Workers", State: capstanv1.StageInProgress, Stuck: true, StartedAt: second(2), Message: "waiting for the workers"}}),
			forge.StateFailure, "stage Workers stuck: waiting for the workers", "| `Workers` | InProgress (stuck) |"},
		{"a stalled deployment fails the status",
			rolloutAt([]capstanv1.StageStatus{ready}, metav1.Condition{Type: capstanv1.ConditionStalled, Status: metav1.ConditionTrue, Message: "render: bad field"}),
			forge.StateFailure, "Stalled: render: bad field", "| `Config` | Ready | 10:00:00Z | 2s |  |"},
		{"Ready succeeds with the time it took",
			rolloutAt([]capstanv1.StageStatus{ready, {Name: "Workers", State: capstanv1.StageReady, StartedAt: second(2), FinishedAt: second(9)}},
				metav1.Condition{Type: capstanv1.ConditionReady, Status: metav1.ConditionTrue}),
			forge.StateSuccess, "Ready: 2 stages in 9s", "| `Workers` | Ready | 10:00:02Z | 7s |  |"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state, desc := commitState(tc.cd)
			if state != tc.state || desc != tc.desc {
				t.Errorf("commit state = %s %q, want %s %q", state, desc, tc.state, tc.desc)
			}
			section := rolloutSection(tc.cd)
			if !strings.Contains(section, tc.tableLine) {
				t.Errorf("rollout section has no line %q:\n%s", tc.tableLine, section)
			}
			// No running clock: the section changes only with the status.
			if again := rolloutSection(tc.cd); again != section {
				t.Errorf("the section changed without a status change")
			}
		})
	}
}

func TestRevisionSHA(t *testing.T) {
	for rev, want := range map[string]string{
		"main@sha1:2d8e8f734311d9210a915121c696bc5cbf1eb515": "2d8e8f734311d9210a915121c696bc5cbf1eb515",
		"v1.2.3@sha1:abc":             "abc",
		"oci://registry/x@sha256:abc": "",
		"":                            "",
	} {
		if got := revisionSHA(rev); got != want {
			t.Errorf("revisionSHA(%q) = %q, want %q", rev, got, want)
		}
	}
}

// The plan part of a comment is read back as it was written, whatever the
// plan and the rollout above it hold: rules, plan headings and markers in
// a plan's diff or in a stage message do not move the separator. Comments
// of the layout before the marker are read too; a note stays a note, and
// a comment the forge cut gives no plan.
func TestPlanOfCommentReadsBackWhatWasWritten(t *testing.T) {
	shop := strings.TrimPrefix(RenderPlanComment(PlanCommentInput{Revision: "refs/pull/7/head@sha1:4f2c", PRNumber: 7,
		Deployments: []PlanCommentDeployment{{Name: "shop", Namespace: "fleet", Diff: planFixture(t, "shop.json")}}}), PlanMarker+"\n")
	tricky := planHeading + " for #7\n\n```diff\n---\n+ a: \"\\n---\\n\\n" + planPartMarker + "\"\n```\n\n---\n\n" + planPartMarker + "\n" + planHeading + "\n"
	ready := capstanv1.StageStatus{Name: "Config", State: capstanv1.StageReady, StartedAt: second(0), FinishedAt: second(2)}
	rule := rolloutAt([]capstanv1.StageStatus{ready, {Name: "Workers", State: capstanv1.StageInProgress, StartedAt: second(2), Message: "---"}})
	rule.Status.Conditions = []metav1.Condition{{Type: capstanv1.ConditionReady, Status: metav1.ConditionFalse, Message: "---"}}
	marker := rolloutAt([]capstanv1.StageStatus{ready, {Name: "Workers", State: capstanv1.StageInProgress, StartedAt: second(2),
		Message: "\n" + planPartMarker + "\n" + planHeading}})
	pr := forge.PullRequest{Number: 7, MergeCommitSHA: "2d8e8f734311d9210a915121c696bc5cbf1eb515"}
	rollout := func(cd *capstanv1.ClusterDeployment) string { return rolloutHeader(pr) + rolloutSection(cd) }

	for _, tc := range []struct {
		name       string
		body       string
		plan, note string
	}{
		{"a plan alone, written while the pull request was open", shop, shop, ""},
		{"a rollout, then the plan", rollout(rule) + (&prState{plan: shop}).planPart(), shop, ""},
		{"a plan holding rules, headings and the marker", rollout(rule) + (&prState{plan: tricky}).planPart(), tricky, ""},
		{"a stage message that looks like the separator", rollout(marker) + (&prState{plan: shop}).planPart(), shop, ""},
		{"the layout before the marker", rollout(rule) + oldPlanSeparator + shop, shop, ""},
		{"a note of the layout before the marker stays", rollout(rule) + oldPlanSeparator + noteRestarted, "", noteRestarted},
		{"a note stays, with its reason", rollout(rule) + (&prState{missing: noteNoComment}).planPart(), "", noteNoComment},
		{"line ends the forge turned into CRLF", strings.ReplaceAll(rollout(rule)+(&prState{plan: shop}).planPart(), "\n", "\r\n"), shop, ""},
		{"a comment the forge cut", rollout(rule) + (&prState{plan: shop}).planPart()[:200] +
			"\n\n**Cut:** this comment is 70000 characters, more than the forge takes (65536); `capstan diff` prints all of it.\n", "", noteCut},
		{"a rollout with no plan part", rollout(rule), "", noteUnreadable},
		{"text Capstan did not write", "hello", "", noteUnreadable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan, note := planOfComment(tc.body)
			if plan != tc.plan || note != tc.note {
				t.Errorf("planOfComment:\n plan %q\n note %q\nwant\n plan %q\n note %q\nof\n%s", plan, note, tc.plan, tc.note, tc.body)
			}
		})
	}
}

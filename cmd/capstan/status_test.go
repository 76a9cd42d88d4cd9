package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// clock is the fixed "now" of the golden files.
var clock = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) *metav1.Time {
	t := metav1.NewTime(clock.Add(-d))
	return &t
}

func cond(typ string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg}
}

// bootstrapStages are the 15 stages of the bootstrap plan (DESIGN.md).
var bootstrapStages = []string{
	"ProxySettingsHandled", "ClusterSSHConfigured", "ProviderUpdatedInBootstrap", "ProviderEnabledInBootstrap",
	"NodesReady", "ObjectsCreated", "ProviderConfigured", "HelmBundleReady", "ControllersDisabledBeforePivot",
	"PivotDone", "ControllersEnabledAfterPivot", "MachinesLCMAgentUpdated", "HelmControllerDisabledBeforeConfig",
	"HelmControllerConfigUpdated", "ClusterReady",
}

// fixtures covers every phase: a long plan stuck half-way, a Ready one, a
// stalled one with a multi-line error, one never reconciled, a suspended one.
func fixtures() []capstanv1.ClusterDeployment {
	const rev = "main@sha1:4f2c1a9b3c4d5e6f708192a3b4c5d6e7f8091a2b"
	east := capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "capstan-system", Name: "mgmt-east"}}
	east.Status.Revision, east.Status.CurrentStage = rev, "ObjectsCreated"
	for i, name := range bootstrapStages {
		st := capstanv1.StageStatus{Name: name, State: capstanv1.StagePending, Revision: rev}
		switch {
		case i < 5:
			st.State, st.Attempts = capstanv1.StageReady, 1
			st.StartedAt, st.FinishedAt = ago(time.Duration(95-10*i)*time.Minute), ago(time.Duration(90-10*i)*time.Minute)
		case i == 5:
			st.State, st.Attempts, st.Stuck = capstanv1.StageInProgress, 37, true
			st.StartedAt = ago(45 * time.Minute)
			st.Message = "Metal3Cluster/capstan-system/mgmt-east: waiting for status.ready (the provider has not reported the control-plane endpoint)"
		}
		east.Status.Stages = append(east.Status.Stages, st)
	}
	east.Status.Conditions = []metav1.Condition{
		cond(capstanv1.ConditionReady, metav1.ConditionFalse, "Progressing", "stage ObjectsCreated: "+east.Status.Stages[5].Message),
		cond(capstanv1.ConditionReconciling, metav1.ConditionTrue, "Progressing", "stage ObjectsCreated"),
	}

	west := capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "capstan-system", Name: "mgmt-west"}}
	west.Status.Revision = "main@sha1:0123456789abcdef0123456789abcdef01234567"
	for i, name := range []string{"HostsRegistered", "InfrastructureReady", "ControlPlaneReady", "WorkersReady-in-a-stage-name-longer-than-the-column"} {
		west.Status.Stages = append(west.Status.Stages, capstanv1.StageStatus{
			Name: name, State: capstanv1.StageReady, Attempts: int32(1 + i%2),
			StartedAt: ago(time.Duration(50-10*i) * time.Hour), FinishedAt: ago(time.Duration(50-10*i)*time.Hour - 3*time.Minute - 7*time.Second),
		})
	}
	west.Status.Conditions = []metav1.Condition{cond(capstanv1.ConditionReady, metav1.ConditionTrue, "Succeeded", "all 4 stages ready")}

	stalled := capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "edge-01"}}
	stalled.Status.Revision = "main@sha1:fedcba9876543210fedcba9876543210fedcba98"
	msg := "render clusters/edge-01 at main@sha1:fedcba98: kustomization.yaml: resource hosts.yaml: no such file\nnetwork.yaml: ConfigMap/lab/network: data.podCIDR: invalid CIDR \"10.300.0.0/16\""
	stalled.Status.Conditions = []metav1.Condition{
		cond(capstanv1.ConditionReady, metav1.ConditionFalse, "RenderFailed", msg),
		cond(capstanv1.ConditionStalled, metav1.ConditionTrue, "RenderFailed", msg),
	}

	fresh := capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "edge-02"}}

	retrying := capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "edge-03"}}
	retrying.Status.Revision = "main@sha1:aaaaaaaaaaaabbbbbbbbbbbbccccccccccccdddd"
	retrying.Status.CurrentStage = "Infra"
	retrying.Status.Stages = []capstanv1.StageStatus{
		{Name: "Infra", State: capstanv1.StageFailed, Attempts: 4, StartedAt: ago(90 * time.Second), Message: "apply Widget/lab/infra: connection refused"},
		{Name: "App", State: capstanv1.StagePending},
	}
	retrying.Status.Conditions = []metav1.Condition{cond(capstanv1.ConditionReady, metav1.ConditionFalse, "StageFailed", "stage Infra: apply Widget/lab/infra: connection refused")}

	suspended := west
	suspended.Namespace, suspended.Name = "lab", "edge-04"
	suspended.Spec.Suspend = true
	return []capstanv1.ClusterDeployment{stalled, east, retrying, west, fresh, suspended}
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)

// assertFits fails for every line wider than width once colour is removed.
func assertFits(t *testing.T, out string, width int) {
	t.Helper()
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if n := utf8.RuneCountInString(ansi.ReplaceAllString(line, "")); n > width {
			t.Errorf("line %d is %d columns wide, over %d: %q", i+1, n, width, line)
		}
	}
}

func TestStatusTableGolden(t *testing.T) {
	for _, tc := range []struct {
		name  string
		view  view
		files string
	}{
		{"plain output is 100 columns wide", view{now: clock, width: maxWidth}, "golden/status.txt"},
		{"a terminal gets colour", view{now: clock, width: maxWidth, color: true}, "golden/status-color.txt"},
		{"a narrow terminal gets a narrow table", view{now: clock, width: minWidth}, "golden/status-narrow.txt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items := fixtures()
			sortDeployments(items)
			out := tc.view.renderFrame(items, "in any namespace")
			assertFits(t, out, tc.view.width)
			if got := strings.Contains(out, "\x1b["); got != tc.view.color {
				t.Errorf("colour codes in output: %t, want %t", got, tc.view.color)
			}
			golden(t, tc.files, out)
		})
	}
}

func TestProgressBarGolden(t *testing.T) {
	v := view{now: clock, width: maxWidth}
	var b strings.Builder
	for _, c := range []struct{ done, total, width int }{
		{0, 0, 12}, {0, 15, 32}, {1, 15, 32}, {7, 15, 32}, {14, 15, 32}, {15, 15, 32}, {2, 3, 12}, {50, 100, 62},
	} {
		bar := v.progressBar(c.done, c.total, c.width)
		if n := utf8.RuneCountInString(bar); n != c.width {
			t.Errorf("bar for %d/%d is %d wide, want %d", c.done, c.total, n, c.width)
		}
		fmt.Fprintf(&b, "%3d/%-3d %s\n", c.done, c.total, bar)
	}
	golden(t, "golden/progress.txt", b.String())
}

func TestStatusJSONGolden(t *testing.T) {
	items := fixtures()
	sortDeployments(items)
	data, err := encodeSummaries(summarize(items), "json")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "golden/status.json", string(data))
}

func TestStatusRefusesUnknownOutput(t *testing.T) {
	_, err := runCLI(t, "status", "-o", "table", "--kubeconfig", "/nonexistent")
	if err == nil || !strings.Contains(err.Error(), `--output "table"`) {
		t.Errorf("status -o table: %v, want an error naming the format", err)
	}
}

func TestEventsGolden(t *testing.T) {
	ref := corev1.ObjectReference{Kind: capstanv1.ClusterDeploymentKind, Namespace: "capstan-system", Name: "mgmt-east"}
	ev := func(name string, at time.Duration, typ, reason, note string) eventsv1.Event {
		return eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "capstan-system"},
			EventTime:  metav1.NewMicroTime(clock.Add(-at)), Regarding: ref, Type: typ, Reason: reason, Note: note,
		}
	}
	repeated := ev("e4", 20*time.Minute, "Warning", "StageFailed", "stage ObjectsCreated attempt 3 failed: apply Metal3Cluster/capstan-system/mgmt-east: the server is currently unable to handle the request (get metal3clusters.infrastructure.cluster.x-k8s.io)")
	repeated.Series = &eventsv1.EventSeries{Count: 5, LastObservedTime: metav1.NewMicroTime(clock.Add(-2 * time.Minute))}
	other := ev("e9", 10*time.Minute, "Normal", "StageReady", "another deployment")
	other.Regarding.Name = "mgmt-west"
	all := []eventsv1.Event{
		repeated,
		ev("e2", 50*time.Minute, "Normal", "StageReady", "stage NodesReady ready after 9m58s"),
		other,
		ev("e1", 60*time.Minute, "Normal", "StageInProgress", "stage NodesReady started at main@sha1:4f2c1a9b (3 objects)"),
		ev("e3", 49*time.Minute, "Normal", "StageInProgress", "stage ObjectsCreated started at main@sha1:4f2c1a9b (12 objects)"),
	}
	events := eventsOf(all, "capstan-system", "mgmt-east")
	if len(events) != 4 {
		t.Fatalf("eventsOf kept %d events, want the 4 about mgmt-east", len(events))
	}
	v := view{now: clock, width: maxWidth}
	out := v.renderEvents(events, "capstan-system/mgmt-east")
	assertFits(t, out, maxWidth)
	golden(t, "golden/events.txt", out)
	if empty := v.renderEvents(nil, "lab/x"); !strings.HasPrefix(empty, "No events for ClusterDeployment lab/x") {
		t.Errorf("no events: %q", empty)
	}
}

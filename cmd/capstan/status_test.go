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

// bootstrapStages are seed 000's 15 states (DESIGN.md), a plan of real size for the golden tables.
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

	// A new revision that does not render: the stages in status are the
	// last walk's, at the revision before, all Ready.
	stalled := capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "lab", Name: "edge-01"}}
	stalled.Status.Revision = "main@sha1:fedcba9876543210fedcba9876543210fedcba98"
	for _, st := range west.Status.Stages[:3] {
		st.Revision = west.Status.Revision
		stalled.Status.Stages = append(stalled.Status.Stages, st)
	}
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

	// Ready at the last revision fetched, while the source is out.
	outage := *west.DeepCopy()
	outage.Namespace, outage.Name = "lab", "edge-05"
	outage.Status.Conditions = append(outage.Status.Conditions, cond("SourceReady", metav1.ConditionFalse, "GitOperationFailed",
		"fetch https://git.example/infra.git: dial tcp 10.0.0.7:443: connect: connection refused"))

	// A preflight that found several problems in a new revision, at the
	// same spec: every line of the report, no stage of the walk before.
	preflight := *west.DeepCopy()
	preflight.Namespace, preflight.Name = "lab", "edge-06"
	preflight.Status.Revision = "main@sha1:5555555555555555555555555555555555555555"
	report := "preflight found 3 errors, 1 warning; nothing was applied:\n" +
		"ERROR Metal3Cluster lab/edge-06: apiVersion: Metal3Cluster is served as infrastructure.cluster.x-k8s.io/v1beta1; not v1alpha5; write the object in infrastructure.cluster.x-k8s.io/v1beta1 (in cluster.yaml)\n" +
		"ERROR ConfigMap edge/network: metadata.namespace: namespace edge does not exist and no earlier stage creates it; add a Namespace object or set namespace: in kustomization.yaml (in network.yaml)\n" +
		"ERROR stage Workers: select: selects no object; set allowEmpty: true if it is meant to be empty\n" +
		"WARNING KubeadmControlPlane lab/edge-06: apiVersion: controlplane.cluster.x-k8s.io/v1beta1 is deprecated; write the object in controlplane.cluster.x-k8s.io/v1beta2 (in controlplane.yaml)"
	preflight.Status.Conditions = []metav1.Condition{
		cond(capstanv1.ConditionReady, metav1.ConditionFalse, "PreflightFailed", report),
		cond(capstanv1.ConditionStalled, metav1.ConditionTrue, "PreflightFailed", report),
	}
	return []capstanv1.ClusterDeployment{stalled, east, retrying, west, fresh, suspended, outage, preflight}
}

// upgrading is a deployment of the lcm profile half-way through an
// upgrade: managers done, workers rolling in batches, each stage with the
// progress the executor counted.
func upgrading() capstanv1.ClusterDeployment {
	const rev = "release-2.1@sha1:9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d"
	cd := capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "east"}}
	cd.Status.Revision, cd.Status.CurrentStage = rev, "WorkersDeployed"
	stage := func(name string, state capstanv1.StageState, started, took time.Duration, p *capstanv1.StageProgress, msg string) capstanv1.StageStatus {
		st := capstanv1.StageStatus{Name: name, State: state, Revision: rev, Progress: p, Message: msg, Objects: 1}
		if state != capstanv1.StagePending {
			st.Attempts, st.StartedAt = 1, ago(started)
		}
		if state == capstanv1.StageReady {
			st.FinishedAt = ago(started - took)
		}
		return st
	}
	progress := func(done, total int32, unit string) *capstanv1.StageProgress {
		return &capstanv1.StageProgress{Done: done, Total: total, Unit: unit}
	}
	// The stages of the lcm profile (capstan profiles show lcm).
	cd.Status.Stages = []capstanv1.StageStatus{
		stage("LCMObjectsCreated", capstanv1.StageReady, 3*time.Hour, 4*time.Second, progress(126, 126, "objects ready"), ""),
		stage("MachinesPrepared", capstanv1.StageReady, 3*time.Hour, 21*time.Minute, progress(125, 125, "machines prepared"), ""),
		stage("ManagersDeployed", capstanv1.StageReady, 158*time.Minute, 34*time.Minute, progress(5, 5, "managers ready"), ""),
		stage("FirstWorkerDeployed", capstanv1.StageReady, 124*time.Minute, 6*time.Minute, progress(1, 1, "workers ready"), ""),
		stage("HelmControllerInstalled", capstanv1.StageReady, 118*time.Minute, 2*time.Second, progress(3, 3, "objects ready"), ""),
		stage("WorkersDeployed", capstanv1.StageInProgress, 118*time.Minute, 0, progress(100, 120, "workers ready"),
			"LCMCluster/prod/east: 100/120 workers Ready, 10 at work (at most 10 at once), 10 waiting for a slot; worker-101 Upgrade (kubelet 1 Running, attempt 1)"),
	}
	for i, n := range []int32{126, 126, 126, 126, 3, 126} {
		cd.Status.Stages[i].Objects = n
	}
	cd.Status.Conditions = []metav1.Condition{
		cond(capstanv1.ConditionReady, metav1.ConditionFalse, "Progressing", "stage WorkersDeployed: "+cd.Status.Stages[5].Message),
		cond(capstanv1.ConditionReconciling, metav1.ConditionTrue, "Progressing", "stage WorkersDeployed"),
	}
	return cd
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
		items []capstanv1.ClusterDeployment
		file  string
	}{
		{"80 columns, what a pipe gets", view{width: 80}, fixtures(), "golden/status-80.txt"},
		{"200 columns: whole messages", view{width: 200}, fixtures(), "golden/status-200.txt"},
		{"a terminal gets colour", view{width: 100, color: true}, fixtures(), "golden/status-color.txt"},
		{"a narrow terminal gets a narrow table", view{width: minWidth}, fixtures(), "golden/status-narrow.txt"},
		{"wide at 80 columns: full revisions, objects, messages wrapped", view{width: 80, wide: true}, fixtures(), "golden/status-wide-80.txt"},
		{"no headers", view{width: 80, noHeaders: true}, fixtures()[:2], "golden/status-80-no-headers.txt"},
		{"an upgrade under way, at 80 columns", view{width: 80}, []capstanv1.ClusterDeployment{upgrading()}, "golden/status-upgrade-80.txt"},
		{"an upgrade under way, wide at 120 columns", view{width: 120, wide: true}, []capstanv1.ClusterDeployment{upgrading()}, "golden/status-upgrade-wide-120.txt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sortDeployments(tc.items)
			tc.view.now = clock
			out := tc.view.renderFrame(tc.items, "in any namespace")
			assertFits(t, out, tc.view.width)
			if got := strings.Contains(out, "\x1b["); got != tc.view.color {
				t.Errorf("colour codes in output: %t, want %t", got, tc.view.color)
			}
			if got := strings.Contains(out, "NAME  "); got == tc.view.noHeaders {
				t.Errorf("header lines printed: %t, want %t", got, !tc.view.noHeaders)
			}
			golden(t, tc.file, out)
		})
	}
}

// A failure before the first stage (render, preflight, source) prints the
// failure, never the ticks or the counts of an earlier walk's stages.
func TestStatusShowsAFailureBeforeTheStagesAlone(t *testing.T) {
	for _, cd := range fixtures() {
		if cd.Status.StagesCurrent() {
			continue
		}
		for _, v := range []view{{width: 80}, {width: 200, wide: true}} {
			v.now = clock
			out := v.renderFrame([]capstanv1.ClusterDeployment{cd}, "")
			for _, stale := range []string{"stages ready", "[#", "Ready  ", "ready after"} {
				if strings.Contains(out, stale) {
					t.Errorf("%s at %d columns prints %q beside its failure:\n%s", cd.Name, v.width, stale, out)
				}
			}
			if !strings.Contains(out, "no stage ran at this revision") {
				t.Errorf("%s: does not say that no stage ran:\n%s", cd.Name, out)
			}
		}
		if row := getRows([]capstanv1.ClusterDeployment{cd})[0]; row.Stage != "-" || row.StagesTotal != 0 {
			t.Errorf("%s: get shows stage %q, %d stages", cd.Name, row.Stage, row.StagesTotal)
		}
		if s := cd.Status.Summarize(); s.Stage != "-" {
			t.Errorf("%s: status.summary.stage = %q, want -", cd.Name, s.Stage)
		}
	}
	// A long report is cut to maxFailureLines without -o wide.
	cd := fixtures()[7]
	c := &cd.Status.Conditions[1]
	c.Message += strings.Repeat("\nERROR ConfigMap lab/x: data: invalid", 30)
	out := view{width: 80, now: clock}.renderFrame([]capstanv1.ClusterDeployment{cd}, "")
	if n := strings.Count(out, "\n"); n != 1+maxFailureLines+1 {
		t.Errorf("%d lines for a 35-line report, want the header, %d lines of it and one saying no stage ran:\n%s", n, maxFailureLines, out)
	}
	if !strings.Contains(out, "… and 24 more lines") {
		t.Errorf("the cut does not say how many lines are left out:\n%s", out)
	}
}

func TestProgressBarGolden(t *testing.T) {
	v := view{now: clock, width: 100}
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
	data, err := encode(summarize(items), "json")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "golden/status.json", string(data))
}

// status, get and events take the same output flags, and refuse the same
// mistakes before they read a cluster.
func TestOutputFlagsAreRefusedAlike(t *testing.T) {
	for _, command := range []string{"status", "get", "events x"} {
		for flags, want := range map[string]string{
			"-o table":   `--output "table": expected wide, yaml or json`,
			"--width -3": "--width -3: must be positive",
		} {
			args := append(strings.Fields(command+" "+flags), "--kubeconfig", "/nonexistent")
			if _, err := runCLI(t, args...); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s %s: %v, want an error saying %q", command, flags, err, want)
			}
		}
	}
}

func TestEventsGolden(t *testing.T) {
	ref := corev1.ObjectReference{Kind: capstanv1.ClusterDeploymentKind, Namespace: "capstan-system", Name: "mgmt-east"}
	ev := func(name string, at time.Duration, typ, reason, note string) eventsv1.Event {
		return eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "capstan-system"},
			EventTime:  metav1.NewMicroTime(clock.Add(-at)), Regarding: ref, Type: typ, Reason: reason, Note: note,
			ReportingController: "capstan.dev/reconciler", ReportingInstance: "capstan-6f9c8d7b5-x2k4q",
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
	for _, v := range []view{{width: 80}, {width: 200}, {width: 80, wide: true}, {width: 80, noHeaders: true}} {
		v.now = clock
		out := v.renderEvents(events, "capstan-system/mgmt-east")
		assertFits(t, out, v.width)
		file := fmt.Sprintf("golden/events-%d.txt", v.width)
		switch {
		case v.wide:
			file = fmt.Sprintf("golden/events-wide-%d.txt", v.width)
		case v.noHeaders:
			file = fmt.Sprintf("golden/events-%d-no-headers.txt", v.width)
		}
		golden(t, file, out)
	}
	data, err := encode(eventRows(events), "json")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "golden/events.json", string(data))
	v := view{now: clock, width: 80}
	if empty := v.renderEvents(nil, "lab/x"); !strings.HasPrefix(empty, "No events for ClusterDeployment lab/x") {
		t.Errorf("no events: %q", empty)
	}
}

package metrics_test

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/ssa"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
)

var epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newCollector(t testing.TB) (*metrics.Collector, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	c, err := metrics.New(reg, metrics.WithClock(func() time.Time { return epoch }))
	if err != nil {
		t.Fatal(err)
	}
	return c, reg
}

// sample is one series as Prometheus would store it.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

func (s sample) String() string {
	keys := make([]string, 0, len(s.labels))
	for k := range s.labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%q", k, s.labels[k])
	}
	return fmt.Sprintf("%s{%s} %g", s.name, strings.Join(parts, ","), s.value)
}

// gather returns every series the registry exposes, histograms expanded
// into their _bucket (with +Inf), _sum and _count series.
func gather(t testing.TB, reg prometheus.Gatherer) []sample {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []sample
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					out = append(out, sample{f.GetName() + "_bucket", with(labels, "le", fmt.Sprint(b.GetUpperBound())), float64(b.GetCumulativeCount())})
				}
				out = append(out,
					sample{f.GetName() + "_bucket", with(labels, "le", "+Inf"), float64(h.GetSampleCount())},
					sample{f.GetName() + "_sum", labels, h.GetSampleSum()},
					sample{f.GetName() + "_count", labels, float64(h.GetSampleCount())})
			case dto.MetricType_COUNTER:
				out = append(out, sample{f.GetName(), labels, m.GetCounter().GetValue()})
			default:
				out = append(out, sample{f.GetName(), labels, m.GetGauge().GetValue()})
			}
		}
	}
	return out
}

func with(labels map[string]string, k, v string) map[string]string {
	out := make(map[string]string, len(labels)+1)
	for a, b := range labels {
		out[a] = b
	}
	out[k] = v
	return out
}

// find returns the series of name whose labels include want.
func find(samples []sample, name string, want map[string]string) []sample {
	var out []sample
next:
	for _, s := range samples {
		if s.name != name {
			continue
		}
		for k, v := range want {
			if s.labels[k] != v {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// value returns the one series of name with exactly the labels want.
func value(t testing.TB, samples []sample, name string, want map[string]string) float64 {
	t.Helper()
	found := find(samples, name, want)
	if len(found) != 1 {
		t.Fatalf("%s%v: %d series, want 1: %v", name, want, len(found), found)
	}
	return found[0].value
}

func deployment(ns, name string, stages ...capstanv1.StageStatus) *capstanv1.ClusterDeployment {
	return &capstanv1.ClusterDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Status:     capstanv1.ClusterDeploymentStatus{Stages: stages},
	}
}

func started(d time.Duration) *metav1.Time {
	t := metav1.NewTime(epoch.Add(-d))
	return &t
}

func TestStageFamiliesFollowStatus(t *testing.T) {
	c, reg := newCollector(t)
	cd := deployment("ns", "east",
		capstanv1.StageStatus{Name: "Hosts", State: capstanv1.StageReady, StartedAt: started(time.Hour)},
		capstanv1.StageStatus{Name: "Infra", State: capstanv1.StageInProgress, StartedAt: started(10 * time.Minute), Stuck: true},
		capstanv1.StageStatus{Name: "Workers", State: capstanv1.StagePending},
	)
	c.RecordStages(cd)
	got := gather(t, reg)

	for _, st := range cd.Status.Stages {
		ones := 0
		for _, s := range metrics.States {
			v := value(t, got, metrics.StageState, map[string]string{"namespace": "ns", "cluster": "east", "stage": st.Name, "state": string(s)})
			if v == 1 {
				ones++
				if s != st.State {
					t.Errorf("stage %s: state %s is 1, want only %s", st.Name, s, st.State)
				}
			}
		}
		if ones != 1 {
			t.Errorf("stage %s: %d states are 1, want exactly one", st.Name, ones)
		}
	}
	if v := value(t, got, metrics.StageStuck, map[string]string{"cluster": "east", "stage": "Infra"}); v != 1 {
		t.Errorf("stuck stage Infra: stage_stuck = %g, want 1", v)
	}
	if v := value(t, got, metrics.StageStuck, map[string]string{"cluster": "east", "stage": "Workers"}); v != 0 {
		t.Errorf("pending stage Workers: stage_stuck = %g, want 0", v)
	}
	if v := value(t, got, metrics.StageStartedTimestamp, map[string]string{"stage": "Infra"}); v != float64(epoch.Add(-10*time.Minute).Unix()) {
		t.Errorf("stage Infra started at %g, want %d", v, epoch.Add(-10*time.Minute).Unix())
	}
	if n := len(find(got, metrics.StageStartedTimestamp, map[string]string{"stage": "Workers"})); n != 0 {
		t.Errorf("pending stage Workers has %d start-time series, want none", n)
	}

	// The stage becomes Ready: no longer stuck. A stage leaves the plan:
	// its series go.
	cd.Status.Stages[1].State = capstanv1.StageReady
	cd.Status.Stages = cd.Status.Stages[:2]
	c.RecordStages(cd)
	got = gather(t, reg)
	if v := value(t, got, metrics.StageStuck, map[string]string{"cluster": "east", "stage": "Infra"}); v != 0 {
		t.Errorf("Ready stage Infra: stage_stuck = %g, want 0", v)
	}
	for _, name := range []string{metrics.StageState, metrics.StageStuck, metrics.StageStartedTimestamp} {
		if left := find(got, name, map[string]string{"stage": "Workers"}); len(left) != 0 {
			t.Errorf("stage Workers left the plan but %s still has %v", name, left)
		}
	}
}

// The rows read as a sequence of reconciles and the failure count after each.
func TestConsecutiveFailuresCountOnlyFailures(t *testing.T) {
	c, reg := newCollector(t)
	cd := deployment("ns", "east")
	steps := []struct {
		outcome metrics.Outcome
		want    float64
	}{
		{metrics.OutcomeSuccess, 0}, // a stage still waiting is a success
		{metrics.OutcomeError, 1},
		{metrics.OutcomeError, 2},
		{metrics.OutcomeStalled, 3}, // still stalled on the same input
		{metrics.OutcomeSuccess, 0},
		{metrics.OutcomeSuccess, 0},
	}
	for i, s := range steps {
		c.ObserveReconcile(cd, 50*time.Millisecond, s.outcome)
		got := value(t, gather(t, reg), metrics.ReconcileFailures, map[string]string{"namespace": "ns", "cluster": "east"})
		if got != s.want {
			t.Fatalf("after reconcile %d (%s): consecutive failures = %g, want %g", i+1, s.outcome, got, s.want)
		}
	}
	got := gather(t, reg)
	for outcome, want := range map[string]float64{"success": 3, "error": 2, "stalled": 1} {
		if v := value(t, got, metrics.ReconcileDuration+"_count", map[string]string{"result": outcome}); v != want {
			t.Errorf("reconcile_duration_seconds_count{result=%q} = %g, want %g", outcome, v, want)
		}
	}
}

func TestSourceFamilies(t *testing.T) {
	c, reg := newCollector(t)
	cd := deployment("ns", "east")
	labels := map[string]string{"namespace": "ns", "cluster": "east"}

	// A source that never answered looks infinitely stale.
	c.ObserveSource(cd, metrics.SourceObservation{Operation: metrics.SourceRevision, Interval: time.Minute, Err: errors.New("connection refused")})
	got := gather(t, reg)
	if v := value(t, got, metrics.SourceLastSuccess, labels); v != 0 {
		t.Errorf("source never answered: last success = %g, want 0", v)
	}
	if v := value(t, got, metrics.SourceInterval, labels); v != 60 {
		t.Errorf("interval = %g, want 60", v)
	}

	c.ObserveSource(cd, metrics.SourceObservation{Operation: metrics.SourceRevision, Revision: "main@sha1:aaa", Interval: time.Minute})
	c.ObserveSource(cd, metrics.SourceObservation{Operation: metrics.SourceFetch, Revision: "main@sha1:bbb", Duration: 2 * time.Second})
	// A later failure does not move the last success.
	c.ObserveSource(cd, metrics.SourceObservation{Operation: metrics.SourceRevision, Err: errors.New("timeout")})
	got = gather(t, reg)
	if v := value(t, got, metrics.SourceLastSuccess, labels); v != float64(epoch.Unix()) {
		t.Errorf("last success = %g, want %d", v, epoch.Unix())
	}
	revs := find(got, metrics.SourceRevisionInfo, labels)
	if len(revs) != 1 || revs[0].labels["revision"] != "main@sha1:bbb" || revs[0].value != 1 {
		t.Errorf("revision info = %v, want one series for main@sha1:bbb", revs)
	}
	if v := value(t, got, metrics.SourceFetchDuration+"_count", map[string]string{"operation": "revision", "result": "error"}); v != 2 {
		t.Errorf("failed revision checks counted %g, want 2", v)
	}

}

// A suspended deployment keeps its stages' states but raises nothing: it
// is not stuck, not failing, and its source, no longer polled, not stale.
func TestSuspendedDeploymentRaisesNoAlert(t *testing.T) {
	c, reg := newCollector(t)
	cd := deployment("ns", "east",
		capstanv1.StageStatus{Name: "Infra", State: capstanv1.StageInProgress, StartedAt: started(time.Hour), Stuck: true})
	feed(c, cd, "main@sha1:1")
	c.ObserveReconcile(cd, time.Second, metrics.OutcomeError)

	c.RecordSuspended(cd)
	got := gather(t, reg)
	labels := map[string]string{"namespace": "ns", "cluster": "east"}
	for _, name := range []string{metrics.SourceLastSuccess, metrics.SourceInterval, metrics.ReconcileFailures} {
		if left := find(got, name, labels); len(left) != 0 {
			t.Errorf("suspended deployment still has %v", left)
		}
	}
	if v := value(t, got, metrics.StageStuck, map[string]string{"cluster": "east", "stage": "Infra"}); v != 0 {
		t.Errorf("suspended deployment: stage_stuck = %g, want 0", v)
	}
	if v := value(t, got, metrics.StageState, map[string]string{"cluster": "east", "stage": "Infra", "state": "InProgress"}); v != 1 {
		t.Errorf("suspended deployment: stage_state InProgress = %g, want 1 as its status says", v)
	}
	// Resumed and failing again: counting starts over.
	c.ObserveReconcile(cd, time.Second, metrics.OutcomeError)
	if v := value(t, gather(t, reg), metrics.ReconcileFailures, labels); v != 1 {
		t.Errorf("resumed deployment failed once: consecutive failures = %g, want 1", v)
	}
}

func TestForgetDeletesEverySeriesOfTheDeployment(t *testing.T) {
	c, reg := newCollector(t)
	for _, name := range []string{"gone", "kept"} {
		feed(c, deployment("ns", name,
			capstanv1.StageStatus{Name: "Hosts", State: capstanv1.StageReady, StartedAt: started(time.Hour)},
			capstanv1.StageStatus{Name: "Infra", State: capstanv1.StageInProgress, StartedAt: started(time.Minute)},
		), "main@sha1:1")
	}
	c.Forget("ns", "gone")
	got := gather(t, reg)
	for _, s := range got {
		if s.labels["cluster"] == "gone" {
			t.Errorf("forgotten deployment still has %s", s)
		}
	}
	if n := len(find(got, metrics.StageState, map[string]string{"cluster": "kept"})); n != 2*len(metrics.States) {
		t.Errorf("the other deployment has %d stage_state series, want %d", n, 2*len(metrics.States))
	}
	// Recorded again after a Forget (re-created with the same name): the
	// series come back.
	feed(c, deployment("ns", "gone", capstanv1.StageStatus{Name: "Hosts", State: capstanv1.StagePending}), "main@sha1:2")
	if n := len(find(gather(t, reg), metrics.StageState, map[string]string{"cluster": "gone"})); n != len(metrics.States) {
		t.Errorf("re-created deployment has %d stage_state series, want %d", n, len(metrics.States))
	}
}

func TestForSharesOneCollectorPerRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := metrics.For(reg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := metrics.For(reg)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Error("For returned two collectors for one registry")
	}
	if _, err := metrics.New(reg); err == nil {
		t.Error("New on a registry that already holds the families: no error")
	}
	other, err := metrics.For(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if other == a {
		t.Error("For returned the same collector for two registries")
	}
}

// feed plays one reconcile of cd as the reconciler reports it.
func feed(c *metrics.Collector, cd *capstanv1.ClusterDeployment, revision string) {
	c.ObserveSource(cd, metrics.SourceObservation{Operation: metrics.SourceRevision, Revision: revision, Interval: time.Minute, Duration: 20 * time.Millisecond})
	c.ObserveSource(cd, metrics.SourceObservation{Operation: metrics.SourceFetch, Revision: revision, Interval: time.Minute, Duration: time.Second})
	cs := ssa.NewChangeSet()
	for _, action := range []ssa.Action{ssa.CreatedAction, ssa.ConfiguredAction, ssa.UnchangedAction} {
		cs.Add(ssa.ChangeSetEntry{Subject: "ConfigMap/ns/x", Action: action})
	}
	c.CountApply(cd, cs)
	for _, st := range cd.Status.Stages {
		switch st.State {
		case capstanv1.StageReady:
			c.ObserveStageEnd(st.Name, metrics.StageResultReady, 90*time.Second)
		case capstanv1.StageFailed:
			c.ObserveStageEnd(st.Name, metrics.StageResultFailed, 10*time.Second)
		}
	}
	c.RecordStages(cd)
	c.ObserveReconcile(cd, 3*time.Second, metrics.OutcomeSuccess)
}

func TestPivotStateFollowsStatus(t *testing.T) {
	c, reg := newCollector(t)
	cd := deployment("ns", "mgmt", capstanv1.StageStatus{Name: "PivotDone", State: capstanv1.StageInProgress})
	c.RecordStages(cd)
	if n := len(find(gather(t, reg), metrics.PivotState, map[string]string{"cluster": "mgmt"})); n != 0 {
		t.Errorf("no move yet, but %d pivot_state series", n)
	}
	for _, phase := range []capstanv1.PivotPhase{capstanv1.PivotCopied, capstanv1.PivotCleanedUp} {
		cd.Status.Pivot = &capstanv1.PivotStatus{Phase: phase}
		c.RecordStages(cd)
		got := gather(t, reg)
		for _, p := range capstanv1.PivotPhases {
			want := 0.0
			if p == phase {
				want = 1
			}
			if v := value(t, got, metrics.PivotState, map[string]string{"namespace": "ns", "cluster": "mgmt", "phase": string(p)}); v != want {
				t.Errorf("after %s: pivot_state{phase=%s} = %g, want %g", phase, p, v, want)
			}
		}
	}
	c.Forget("ns", "mgmt")
	if left := find(gather(t, reg), metrics.PivotState, map[string]string{"cluster": "mgmt"}); len(left) != 0 {
		t.Errorf("after Forget: %v", left)
	}
}

package manifests_test

import (
	"flag"
	"regexp"
	"sort"
	"testing"
	"time"

	"github.com/fluxcd/pkg/ssa"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
)

var update = flag.Bool("update", false, "rewrite generated files (alerts/prometheusrule.yaml)")

// exportedMetrics returns the name of every series the collector exports
// once it has seen a deployment, histograms as their _bucket, _sum and
// _count series.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	c, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	cd := &capstanv1.ClusterDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "east"},
		Status: capstanv1.ClusterDeploymentStatus{Stages: []capstanv1.StageStatus{
			{Name: "Infra", State: capstanv1.StageInProgress, StartedAt: &now, Stuck: true},
		}},
	}
	c.RecordStages(cd)
	c.ObserveStageEnd("Infra", metrics.StageResultReady, time.Minute)
	c.ObserveReconcile(cd, time.Second, metrics.OutcomeError)
	c.ObserveSource(cd, metrics.SourceObservation{Operation: metrics.SourceRevision, Revision: "main@sha1:1", Interval: time.Minute})
	cs := ssa.NewChangeSet()
	cs.Add(ssa.ChangeSetEntry{Subject: "ConfigMap/ns/a", Action: ssa.CreatedAction})
	c.CountApply(cd, cs)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+suffix] = true
			}
			continue
		}
		names[f.GetName()] = true
	}
	return names
}

var metricName = regexp.MustCompile(`\bcapstan_[a-z0-9_]+`)

// unknownMetrics lists the capstan_ metric names a PromQL expression uses
// that the collector does not export.
func unknownMetrics(expr string, exported map[string]bool) []string {
	var out []string
	for _, name := range metricName.FindAllString(expr, -1) {
		if !exported[name] {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

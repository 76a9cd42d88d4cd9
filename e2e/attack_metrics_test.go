package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
)

// capstanSeries lists the capstan_* series of reg whose labels include want, as
// "family{labels}".
func capstanSeries(t *testing.T, reg *prometheus.Registry, want map[string]string) []string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "capstan_") {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			out = append(out, fmt.Sprintf("%s%v", f.GetName(), labels))
		}
	}
	return out
}

// TestDeletedDeploymentLeavesNoMetricSeries: a deployment's series, and
// the stage-duration histogram of a stage name only it used, go when the
// stage leaves its plan and when the deployment is deleted, in the
// registry the daemon serves.
func TestDeletedDeploymentLeavesNoMetricSeries(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url := pushOwned(t, ns, cm("first", "A")+cm("second", "OnlyHere"))
	reg := prometheus.NewRegistry()
	startDaemonWith(t, nil, func(o *reconciler.Options) { o.MetricsRegistry = reg })
	createDeployment(t, c, ns, "counted", ownedSpec(url, ns, gitSecret(t, c, ns), "A", "OnlyHere"))
	cd := waitDeployment(t, c, ns, "counted", "Ready", isReady)
	mine := map[string]string{"namespace": ns, "cluster": "counted"}
	onlyHere := map[string]string{"stage": "OnlyHere"}
	if len(capstanSeries(t, reg, mine)) == 0 || len(capstanSeries(t, reg, onlyHere)) == 0 {
		t.Fatalf("a Ready deployment with stage OnlyHere exports %v and %v", capstanSeries(t, reg, mine), capstanSeries(t, reg, onlyHere))
	}

	// Stage OnlyHere leaves the plan, and its ConfigMap the overlay.
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, ownedRepo(cm("first", "A")), "v2"); err != nil {
		t.Fatal(err)
	}
	before := cd.DeepCopy()
	cd.Spec.Stages = cd.Spec.Stages[:1]
	if err := c.Patch(context.Background(), cd, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the series of stage OnlyHere gone", func() (bool, error) {
		return len(capstanSeries(t, reg, onlyHere)) == 0, nil
	})

	if err := c.Delete(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every series of ClusterDeployment "+ns+"/counted gone", func() (bool, error) {
		left := capstanSeries(t, reg, mine)
		return len(left) == 0 && len(capstanSeries(t, reg, map[string]string{"stage": "A"})) == 0, nil
	})
}

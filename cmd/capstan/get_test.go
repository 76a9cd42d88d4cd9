package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// getFixtures are the deployments of the status golden files, with the
// times and sources that `capstan get` shows.
func getFixtures() []capstanv1.ClusterDeployment {
	items := fixtures()
	for i := range items {
		cd := &items[i]
		cd.CreationTimestamp = *ago(time.Duration(3+i) * 24 * time.Hour)
		for j := range cd.Status.Conditions {
			cd.Status.Conditions[j].LastTransitionTime = *ago(time.Duration(7*(i+1)) * time.Minute)
		}
		switch i % 3 {
		case 0:
			cd.Spec.Source = &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: "https://git.example/infra.git", Ref: capstanv1.GitRef{SemVer: ">=1.0.0"}}}
		case 1:
			cd.Spec.Source = &capstanv1.SourceSpec{OCI: &capstanv1.OCISource{URL: "oci://registry.example/clusters/edge", Ref: capstanv1.OCIRef{Tag: "v2"}}}
		}
	}
	sortDeployments(items)
	return items
}

func TestGetTableGolden(t *testing.T) {
	for _, tc := range []struct {
		name       string
		view       view
		namespaces bool
		file       string
	}{
		{"80 columns, every namespace", view{width: 80}, true, "golden/get-80.txt"},
		{"200 columns, every namespace", view{width: 200}, true, "golden/get-200.txt"},
		{"80 columns, one namespace, no headers", view{width: 80, noHeaders: true}, false, "golden/get-80-no-headers.txt"},
		{"wide at 200 columns", view{width: 200, wide: true}, true, "golden/get-wide-200.txt"},
		{"wide at 80 columns: whole messages, past the width", view{width: 80, wide: true}, false, "golden/get-wide-80.txt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.view.now = clock
			out := tc.view.renderGet(getRows(getFixtures()), tc.namespaces)
			if !tc.view.wide {
				assertFits(t, out, tc.view.width)
			}
			if got := strings.HasPrefix(out, "NAME") || strings.HasPrefix(out, "NAMESPACE"); got == tc.view.noHeaders {
				t.Errorf("header line printed: %t, want %t", got, !tc.view.noHeaders)
			}
			golden(t, tc.file, out)
		})
	}
}

func TestGetJSONGolden(t *testing.T) {
	data, err := encode(getRows(getFixtures()), "json")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "golden/get.json", string(data))
}

func TestGetRefusesBadFlags(t *testing.T) {
	for args, want := range map[string]string{
		"get -A x":    "NAME needs a namespace",
		"get -n a -A": "exclude each other",
	} {
		_, err := runCLI(t, append(strings.Fields(args), "--kubeconfig", "/nonexistent")...)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", args, err, want)
		}
	}
}

func TestStageTextShowsTheStageAndTheCounts(t *testing.T) {
	stages := func(states ...capstanv1.StageState) []capstanv1.StageStatus {
		var out []capstanv1.StageStatus
		for i, s := range states {
			out = append(out, capstanv1.StageStatus{Name: fmt.Sprint("S", i), State: s})
		}
		return out
	}
	r, p := capstanv1.StageReady, capstanv1.StagePending
	for _, tc := range []struct {
		status capstanv1.ClusterDeploymentStatus
		want   string
	}{
		{capstanv1.ClusterDeploymentStatus{}, "-"},
		{capstanv1.ClusterDeploymentStatus{CurrentStage: "S2", Stages: stages(r, r, p, p, p)}, "S2 2/5"},
		{capstanv1.ClusterDeploymentStatus{Stages: stages(r, r)}, "2/2"},
		{capstanv1.ClusterDeploymentStatus{Stages: stages(r, r), Conditions: []metav1.Condition{
			cond(capstanv1.ConditionReady, metav1.ConditionFalse, "RenderFailed", "x")}}, "-"},
	} {
		if got := tc.status.StageText(); got != tc.want {
			t.Errorf("StageText(%+v) = %q, want %q", tc.status, got, tc.want)
		}
	}
	if got := cutStage("ControllersEnabledAfterPivot 10/15", 14); got != "Control… 10/15" {
		t.Errorf("cutStage = %q, want the counts kept whole", got)
	}
}

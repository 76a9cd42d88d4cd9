package main

import (
	"strings"
	"testing"
	"time"

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
		name  string
		table getTable
		file  string
	}{
		{"80 columns, every namespace", getTable{width: 80, namespaces: true}, "golden/get-80.txt"},
		{"200 columns, every namespace", getTable{width: 200, namespaces: true}, "golden/get-200.txt"},
		{"80 columns, one namespace, no headers", getTable{width: 80, noHeaders: true}, "golden/get-80-no-headers.txt"},
		{"wide at 200 columns", getTable{width: 200, namespaces: true, wide: true}, "golden/get-wide-200.txt"},
		{"wide at 80 columns: the message keeps its minimum", getTable{width: 80, wide: true}, "golden/get-wide-80.txt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.table.now = clock
			out := tc.table.render(getRows(getFixtures()))
			if !tc.table.wide {
				assertFits(t, out, tc.table.width)
			}
			if got := strings.HasPrefix(out, "NAME") || strings.HasPrefix(out, "NAMESPACE"); got == tc.table.noHeaders {
				t.Errorf("header line printed: %t, want %t", got, !tc.table.noHeaders)
			}
			golden(t, tc.file, out)
		})
	}
}

func TestGetJSONGolden(t *testing.T) {
	data, err := encodeRows(getRows(getFixtures()), "json")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "golden/get.json", string(data))
}

func TestGetRefusesBadFlags(t *testing.T) {
	for args, want := range map[string]string{
		"get -o table": `--output "table": expected wide, yaml or json`,
		"get -A x":     "NAME needs a namespace",
		"get -n a -A":  "exclude each other",
	} {
		_, err := runCLI(t, append(strings.Fields(args), "--kubeconfig", "/nonexistent")...)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", args, err, want)
		}
	}
}

func TestStageTextShowsTheStageAndTheCounts(t *testing.T) {
	for _, tc := range []struct {
		row  getRow
		want string
	}{
		{getRow{}, "-"},
		{getRow{CurrentStage: "Workers", StagesReady: 2, StagesTotal: 5}, "Workers 2/5"},
		{getRow{StagesReady: 5, StagesTotal: 5}, "5/5"},
	} {
		if got := tc.row.stageText(); got != tc.want {
			t.Errorf("stageText(%+v) = %q, want %q", tc.row, got, tc.want)
		}
	}
	if got := cutStage("ControllersEnabledAfterPivot 10/15", 14); got != "Control… 10/15" {
		t.Errorf("cutStage = %q, want the counts kept whole", got)
	}
}

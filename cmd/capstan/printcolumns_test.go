package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler"
)

// startFixtureCluster starts a control plane with Capstan's CRDs and the
// deployments of the golden files in it, their status as the reconciler
// writes it (status.summary included), and returns its kubeconfig and
// config.
func startFixtureCluster(t *testing.T) (string, *rest.Config) {
	t.Helper()
	env, ctx := startControlPlane(t)
	c, err := client.New(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"capstan-system", "lab"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, cd := range getFixtures() {
		status := cd.Status
		status.Summary = status.Summarize()
		cd.Spec.Path = "clusters/" + cd.Name
		cd.CreationTimestamp = metav1.Time{}
		if err := c.Create(ctx, &cd); err != nil {
			t.Fatalf("create ClusterDeployment %s/%s: %v", cd.Namespace, cd.Name, err)
		}
		cd.Status = status
		if err := c.Status().Update(ctx, &cd); err != nil {
			t.Fatalf("write the status of ClusterDeployment %s/%s: %v", cd.Namespace, cd.Name, err)
		}
	}
	return env.KubeconfigPath, env.Config
}

// table asks the API server for ClusterDeployments as the Table kubectl
// prints, in every namespace.
func table(t *testing.T, cfg *rest.Config) *metav1.Table {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, cfg.Host+"/apis/capstan.dev/v1alpha1/clusterdeployments", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET clusterdeployments as Table: %s %v: %s", resp.Status, err, body)
	}
	var tbl metav1.Table
	if err := json.Unmarshal(body, &tbl); err != nil {
		t.Fatalf("decode the Table: %v", err)
	}
	return &tbl
}

// kubectl get clusterdeployments shows what capstan get shows: the short
// revision, Ready and the stage with its counts (none beside a failure
// before the stages); -o wide adds whether it is suspended and the
// message. The columns are read from a real API server's Table answer.
func TestKubectlColumnsMatchGet(t *testing.T) {
	kubeconfig, cfg := startFixtureCluster(t)
	tbl := table(t, cfg)

	var columns []string
	for _, c := range tbl.ColumnDefinitions {
		columns = append(columns, fmt.Sprintf("%s/%d", c.Name, c.Priority))
	}
	want := []string{"Name/0", "Revision/0", "Suspended/1", "Ready/0", "Stage/0", "Message/1", "Age/0"}
	if !slices.Equal(columns, want) {
		t.Fatalf("printer columns %v, want %v", columns, want)
	}

	out, err := runCLI(t, "get", "-A", "-o", "json", "--kubeconfig", kubeconfig)
	if err != nil {
		t.Fatalf("capstan get: %v\n%s", err, out)
	}
	var rows []getRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("decode capstan get -o json: %v\n%s", err, out)
	}
	if len(rows) != len(tbl.Rows) {
		t.Fatalf("capstan get lists %d deployments, the API server %d", len(rows), len(tbl.Rows))
	}
	fixtures := map[string]capstanv1.ClusterDeployment{}
	for _, cd := range getFixtures() {
		fixtures[cd.Name] = cd
	}
	// cell reads a row's cell the way kubectl prints it: a missing value
	// as "<none>".
	cell := func(r metav1.TableRow, i int) string {
		if r.Cells[i] == nil {
			return "<none>"
		}
		return fmt.Sprint(r.Cells[i])
	}
	for i, r := range tbl.Rows {
		name := cell(r, 0)
		row := rows[slices.IndexFunc(rows, func(g getRow) bool { return g.Name == name })]
		cd := fixtures[name]
		ready := "<none>"
		if c := cd.Status.Conditions; len(c) > 0 {
			ready = string(c[0].Status)
		}
		wantCells := map[int]string{
			1: orDash(formatRevision(row.Revision)),
			3: ready,
			4: row.Stage,
		}
		if row.Revision == "" {
			wantCells[1] = "<none>" // kubectl's word where get prints -
		}
		for col, w := range wantCells {
			if got := cell(r, col); got != w {
				t.Errorf("row %d (%s): kubectl's %s is %q, capstan get's %q", i, name, tbl.ColumnDefinitions[col].Name, got, w)
			}
		}
		if got, w := cell(r, 5), cd.Status.Summarize().Message; got != w && !(got == "<none>" && w == "") || strings.Contains(got, "\n") {
			t.Errorf("row %d (%s): kubectl's Message is %q, want the Ready message on one line, %q", i, name, got, w)
		}
		// The API server defaults spec.suspend: the column never says <none>.
		if got := cell(r, 2); got != fmt.Sprint(row.Suspended) {
			t.Errorf("row %d (%s): kubectl's Suspended is %q, capstan get's %t", i, name, got, row.Suspended)
		}
	}

	// The tables read the same server: every deployment, within the width.
	for _, args := range [][]string{{"get", "-A"}, {"status", "-A"}, {"status", "-A", "-o", "wide"}} {
		out, err := runCLI(t, append(args, "--width", "80", "--kubeconfig", kubeconfig)...)
		if err != nil {
			t.Fatalf("capstan %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		assertFits(t, out, 80)
		for name := range fixtures {
			if !strings.Contains(out, name) {
				t.Errorf("capstan %s does not list %s:\n%s", strings.Join(args, " "), name, out)
			}
		}
	}
	out, err = runCLI(t, "events", "mgmt-east", "-n", "capstan-system", "-o", "json", "--kubeconfig", kubeconfig)
	if err != nil || strings.TrimSpace(out) != "[]" {
		t.Errorf("capstan events -o json of a deployment without events: %v %q, want []", err, out)
	}
}

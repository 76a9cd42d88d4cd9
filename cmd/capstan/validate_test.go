package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// validateArgs runs validate with testdata/validate as the root.
func validateArgs(args ...string) []string {
	return append([]string{"validate", "--root", "testdata/validate"}, args...)
}

// The overlays under testdata/validate: good passes, bad has mistakes in
// every object, warnings has only warnings, substituted takes its pod CIDR
// from ${POD_CIDR}, none has nothing to check.
func TestValidateCommand(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		golden string   // file under testdata the output must equal
		lines  []string // lines the output must hold
		err    string   // the error wanted, "" for success
	}{
		{
			name:  "good settings pass",
			args:  validateArgs("good"),
			lines: []string{"no problems in 3 objects checked (ConfigMap capstan-system/network, Cluster capstan-system/edge, IPPool capstan-system/edge-nodes)"},
		},
		{
			name:   "every problem is printed, one per line, and errors fail",
			args:   validateArgs("bad"),
			golden: "validate/bad.txt",
			err:    "validate testdata/validate/bad: preflight found 5 errors, 3 warnings",
		},
		{
			name: "warnings are printed and pass",
			args: validateArgs("warnings"),
			lines: []string{
				"WARNING ConfigMap capstan-system/network: data.noProxy: does not cover the pod CIDR 10.233.0.0/16: with a proxy set, traffic to it goes through the proxy; add 10.233.0.0/16",
				"WARNING ConfigMap capstan-system/network: data.noProxy: does not cover the control-plane network 192.168.10.0/24: with a proxy set, traffic to it goes through the proxy; add 192.168.10.0/24",
				"0 errors, 2 warnings in 3 objects checked",
			},
		},
		{
			name:  "--substitute values are checked",
			args:  validateArgs("--substitute", "POD_CIDR=10.96.0.0/16", "substituted"),
			lines: []string{"ERROR ConfigMap capstan-system/network: data.podCIDR: 10.96.0.0/16 overlaps the service CIDR 10.96.0.0/12 (data.serviceCIDR); pods and services need separate ranges"},
			err:   "preflight found 1 error, 0 warnings",
		},
		{
			name:  "-f takes the path and substitutions from a ClusterDeployment",
			args:  validateArgs("-f", "testdata/validate/clusterdeployment.yaml"),
			lines: []string{"no problems in 3 objects checked"},
		},
		{
			name:  "without substitutions, ${VAR} stays as written, as the daemon would apply it",
			args:  validateArgs("substituted"),
			lines: []string{`ERROR ConfigMap capstan-system/network: data.podCIDR: "${POD_CIDR:=10.233.0.0/16}" is not a CIDR`},
			err:   "preflight found 1 error",
		},
		{
			name:  "an overlay without network objects has nothing to check",
			args:  validateArgs("none"),
			lines: []string{"nothing to check in 1 object: no ConfigMap labelled capstan.dev/config: network, no Cluster, no IPPool"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runCLI(t, tc.args...)
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("error = %v, want none", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("error = %v, want it to contain %q", err, tc.err)
			}
			if tc.golden != "" {
				golden(t, tc.golden, out)
			}
			got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			for _, line := range tc.lines {
				found := false
				for _, g := range got {
					found = found || strings.HasPrefix(g, line)
				}
				if !found {
					t.Errorf("output has no line starting %q:\n%s", line, out)
				}
			}
		})
	}
}

func TestValidateOutputFormats(t *testing.T) {
	for _, format := range []string{"json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			out, err := runCLI(t, "validate", "--root", "testdata/validate", "-o", format, "bad")
			if err == nil || !strings.Contains(err.Error(), "preflight found 5 errors, 3 warnings") {
				t.Errorf("error = %v, want the errors to fail the command in -o %s too", err, format)
			}
			var report struct {
				preflight.Report
				Served map[string]any `json:"served"`
			}
			if format == "json" {
				err = json.Unmarshal([]byte(out), &report)
			} else {
				err = yaml.UnmarshalStrict([]byte(out), &report)
			}
			if err != nil {
				t.Fatalf("-o %s does not parse: %v\n%s", format, err, out)
			}
			if len(report.Errors()) != 5 || len(report.Warnings()) != 3 || len(report.Checked) != 3 {
				t.Errorf("report has %d errors, %d warnings, %d objects checked; want 5, 3, 3:\n%s",
					len(report.Errors()), len(report.Warnings()), len(report.Checked), out)
			}
			first := report.Problems[0]
			if first.Object != "ConfigMap capstan-system/network" || first.Field != "data.controlPlaneCIDRs[0]" ||
				!strings.Contains(first.Message, "host bits set; did you mean 192.168.10.0/24?") || first.Warning {
				t.Errorf("first problem = %+v", first)
			}
			if len(report.Networks) != 1 || strings.Join(report.Networks[0].PodCIDRs, ",") != "10.96.0.0/16" {
				t.Errorf("networks = %+v, want the ConfigMap's, pods 10.96.0.0/16", report.Networks)
			}
		})
	}
}

func TestValidateErrorsSayWhatToFix(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no path", []string{"validate"}, "give PATH or -f"},
		{"missing overlay", []string{"validate", "--root", "testdata/validate", "nope"}, "render testdata/validate/nope"},
		{"bad substitute flag", []string{"validate", "--root", "testdata/validate", "--substitute", "X", "good"}, "expected VAR=value"},
		{"bad output", []string{"validate", "--root", "testdata/validate", "-o", "xml", "good"}, "expected text, json or yaml"},
		{"missing ClusterDeployment file", []string{"validate", "-f", "testdata/validate/nope.yaml"}, "nope.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runCLI(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// startGizmoCluster starts a control plane whose one custom kind is the
// Gizmo of testdata/gizmos-crd.yaml (v1beta2 served, v1beta1 deprecated,
// v1alpha1 not served) and returns its kubeconfig.
func startGizmoCluster(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a control plane; not under -short")
	}
	// Generous because a first run may build the binaries.
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	env, err := testenv.Start(ctx, testenv.Options{CRDDirs: []string{"testdata/gizmos-crd.yaml"}, Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	// The overlays' namespace exists, as it would in a management
	// cluster; TestValidateClusterPreflight checks a missing one.
	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "capstan-system"}}); err != nil {
		t.Fatal(err)
	}
	return env.KubeconfigPath
}

// validate --kubeconfig looks every object up in the cluster, beside the
// network checks, in the same report and with the same exit rules;
// without it, validate reads no cluster.
func TestValidateServedAPIs(t *testing.T) {
	kubeconfig := startGizmoCluster(t)
	served := []string{
		"nothing to check in 5 objects: no ConfigMap labelled capstan.dev/config: network, no Cluster, no IPPool",
		"ERROR Sprocket capstan-system/nowhere: kind: the cluster serves no Sprocket in group missing.test.capstan.dev: no CustomResourceDefinition in the cluster or earlier in this plan defines it; install the provider first (in served/gizmos.yaml)",
		"ERROR Gizmo capstan-system/ancient: apiVersion: Gizmo is served as served.test.capstan.dev/v1beta2, v1beta1; not v1alpha1; write the object in served.test.capstan.dev/v1beta2 (in served/gizmos.yaml)",
		"WARNING Gizmo capstan-system/deprecated: apiVersion: served.test.capstan.dev/v1beta1 is deprecated (served.test.capstan.dev/v1beta1 Gizmo is deprecated; use served.test.capstan.dev/v1beta2); write the object in served.test.capstan.dev/v1beta2 (in served/gizmos.yaml)",
		"2 errors, 1 warning in 5 objects looked up in the API server https://127.0.0.1:",
	}
	for _, tc := range []struct {
		name  string
		args  []string
		lines []string // lines the output holds, in this order
		exact bool     // and no others
		err   string   // the error wanted, "" for success
	}{
		{
			name:  "every object is looked up, each problem on its line with its file",
			args:  validateArgs("--kubeconfig", kubeconfig, "served"),
			lines: served,
			exact: true,
			err:   "validate testdata/validate/served: preflight found 2 errors, 1 warning",
		},
		{
			name: "network problems and served-API problems are counted together",
			args: validateArgs("--kubeconfig", kubeconfig, "bad"),
			lines: []string{
				"ERROR ConfigMap capstan-system/network: data.controlPlaneCIDRs[0]: 192.168.10.1/24: host bits set; did you mean 192.168.10.0/24?",
				"5 errors, 3 warnings in 3 objects checked (ConfigMap capstan-system/network, Cluster capstan-system/edge, IPPool capstan-system/edge-nodes)",
				"ERROR Cluster capstan-system/edge: kind: the cluster serves no Cluster in group cluster.x-k8s.io: no CustomResourceDefinition in the cluster or earlier in this plan defines it; install the provider first",
				"ERROR IPPool capstan-system/edge-nodes: kind: the cluster serves no IPPool in group ipam.metal3.io",
				"2 errors, 0 warnings in 4 objects looked up in the API server https://127.0.0.1:",
			},
			err: "preflight found 7 errors, 3 warnings",
		},
		{
			name: "--context names the kubeconfig's context",
			args: validateArgs("--kubeconfig", kubeconfig, "--context", "no-such-context", "served"),
			err:  `context "no-such-context" does not exist`,
		},
		{
			name: "without --kubeconfig, validate stays offline and judges only the groups it knows",
			args: validateArgs("served"),
			lines: []string{served[0],
				"no problems in 5 objects checked offline against built-in APIs, Capstan's CRDs, the pinned provider CRDs; 4 objects of groups none of them defines not checked (run with --kubeconfig, or add --crds)"},
			exact: true,
		},
		{
			name: "offline, --crds adds CRDs to judge against",
			args: validateArgs("--crds", "testdata/gizmos-crd.yaml", "served"),
			lines: []string{served[0],
				"ERROR Gizmo capstan-system/ancient: apiVersion: Gizmo is served as served.test.capstan.dev/v1beta2, v1beta1; not v1alpha1; write the object in served.test.capstan.dev/v1beta2 (in served/gizmos.yaml)",
				"WARNING Gizmo capstan-system/deprecated: apiVersion: served.test.capstan.dev/v1beta1 is deprecated",
				"1 error, 1 warning in 5 objects checked offline against built-in APIs, Capstan's CRDs, the pinned provider CRDs, testdata/gizmos-crd.yaml; 1 object of groups none of them defines not checked"},
			exact: true,
			err:   "preflight found 1 error, 1 warning",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runCLI(t, tc.args...)
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("error = %v, want none", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("error = %v, want it to contain %q", err, tc.err)
			}
			got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			next := 0
			for _, line := range tc.lines {
				for next < len(got) && !strings.HasPrefix(got[next], line) {
					next++
				}
				if next == len(got) {
					t.Errorf("output has no line starting %q after the ones before:\n%s", line, out)
					break
				}
			}
			if tc.exact && len(got) != len(tc.lines) {
				t.Errorf("output has %d lines, want %d:\n%s", len(got), len(tc.lines), out)
			}
		})
	}

	for _, format := range []string{"json", "yaml"} {
		t.Run("-o "+format, func(t *testing.T) {
			out, err := runCLI(t, validateArgs("--kubeconfig", kubeconfig, "-o", format, "served")...)
			if err == nil || !strings.Contains(err.Error(), "preflight found 2 errors, 1 warning") {
				t.Errorf("error = %v, want the errors to fail the command in -o %s too", err, format)
			}
			var report struct {
				preflight.Report
				Served struct {
					Server  string `json:"server"`
					Objects int    `json:"objects"`
				} `json:"served"`
			}
			if format == "json" {
				err = json.Unmarshal([]byte(out), &report)
			} else {
				err = yaml.UnmarshalStrict([]byte(out), &report)
			}
			if err != nil {
				t.Fatalf("-o %s does not parse: %v\n%s", format, err, out)
			}
			if len(report.Errors()) != 2 || len(report.Warnings()) != 1 || report.Served.Objects != 5 || !strings.HasPrefix(report.Served.Server, "https://127.0.0.1:") {
				t.Errorf("report has %d errors, %d warnings, served %+v; want 2, 1, 5 objects looked up on loopback:\n%s",
					len(report.Errors()), len(report.Warnings()), report.Served, out)
			}
			if p := report.Errors()[1]; p.Object != "Gizmo capstan-system/ancient" || p.Field != "apiVersion" || !strings.Contains(p.Message, "not v1alpha1") {
				t.Errorf("second error = %+v, want Gizmo ancient's apiVersion", p)
			}
		})
	}
}

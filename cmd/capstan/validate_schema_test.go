package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/stages/preflight"
)

// testdata/validate/schema holds one mistake per object, each one the API
// server refuses under strict field validation: of a Cluster API object
// (MachineDeployment), of a CAPM3 object (Metal3MachineTemplate, whose
// v1beta1 field format is diskFormat in v1beta2) and of a built-in kind
// (Deployment). Offline, validate finds every one against the pinned
// provider CRDs and the embedded Kubernetes OpenAPI, naming file, object
// and field.
func TestValidateOfflineSchema(t *testing.T) {
	want := []string{
		"ERROR Deployment orion/web: spec.replica: schema check: the schema of apps/v1 Deployment declares no such field; check its spelling and the apiVersion (in schema/deployment.yaml)",
		"ERROR MachineDeployment orion/md-missing: spec.clusterName: schema check: the schema of cluster.x-k8s.io/v1beta2 MachineDeployment requires this field; set it (in schema/capi.yaml)",
		`ERROR MachineDeployment orion/md-type: spec.replicas: schema check: does not fit the schema of cluster.x-k8s.io/v1beta2 MachineDeployment: must be of type integer: "string" (in schema/capi.yaml)`,
		"ERROR MachineDeployment orion/md-unknown: spec.replica: schema check: the schema of cluster.x-k8s.io/v1beta2 MachineDeployment declares no such field; check its spelling and the apiVersion (in schema/capi.yaml)",
		"ERROR Metal3MachineTemplate orion/m3-missing: spec.template.spec.image.url: schema check: the schema of infrastructure.cluster.x-k8s.io/v1beta2 Metal3MachineTemplate requires this field; set it (in schema/capm3.yaml)",
		"ERROR Metal3MachineTemplate orion/m3-type: spec.template.spec.image.url: schema check: does not fit the schema of infrastructure.cluster.x-k8s.io/v1beta2 Metal3MachineTemplate: expected a string, number or boolean (in schema/capm3.yaml)",
		"ERROR Metal3MachineTemplate orion/m3-unknown: spec.template.spec.image.format: schema check: the schema of infrastructure.cluster.x-k8s.io/v1beta2 Metal3MachineTemplate declares no such field; check its spelling and the apiVersion (in schema/capm3.yaml)",
		"7 errors, 0 warnings in 8 objects checked offline against built-in APIs, Capstan's CRDs, the pinned provider CRDs",
	}
	out, err := runCLI(t, validateArgs("schema")...)
	if err == nil || !strings.Contains(err.Error(), "preflight found 7 errors, 0 warnings") {
		t.Errorf("error = %v, want the 7 schema errors to fail the command", err)
	}
	got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(got) < 1 || strings.Join(got[1:], "\n") != strings.Join(want, "\n") {
		t.Errorf("output:\n%s\nwant after its first line:\n%s", out, strings.Join(want, "\n"))
	}

	// The good Metal3MachineTemplate, which the others' mistakes surround,
	// passes: the schema check finds mistakes, not objects.
	out, _ = runCLI(t, validateArgs("-o", "json", "schema")...)
	var report preflight.Report
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("-o json does not parse: %v\n%s", err, out)
	}
	for _, p := range report.Problems {
		if strings.Contains(p.Object, "m3-good") {
			t.Errorf("the valid object has a problem: %s", p.Error())
		}
	}
	if len(report.Errors()) != 7 {
		t.Errorf("-o json has %d errors, want 7:\n%s", len(report.Errors()), out)
	}
}

// Problems of one cause are one line, with the objects counted and as
// many named as the width allows; -o json keeps every object.
func TestValidateGroupsProblemsByCause(t *testing.T) {
	for _, tc := range []struct {
		columns string
		line    string
	}{
		{"80", "ERROR 4 objects (ConfigMap orion/host-0 and 3 more): datas: schema check: the schema of v1 ConfigMap declares no such field; check its spelling and the apiVersion (in grouped/hosts.yaml and 1 more file)"},
		{"200", "ERROR 4 objects (ConfigMap orion/host-0, ConfigMap orion/host-1 and 2 more): datas: schema check: the schema of v1 ConfigMap declares no such field; check its spelling and the apiVersion (in grouped/hosts.yaml, network.yaml)"},
	} {
		t.Run(tc.columns, func(t *testing.T) {
			t.Setenv("COLUMNS", tc.columns)
			out, err := runCLI(t, validateArgs("grouped")...)
			if err == nil || !strings.Contains(err.Error(), "preflight found 4 errors, 0 warnings") {
				t.Errorf("error = %v, want 4 errors", err)
			}
			got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(got) != 3 || got[1] != tc.line {
				t.Errorf("output:\n%s\nwant its second line (of 3):\n%s", out, tc.line)
			}
		})
	}
	out, _ := runCLI(t, validateArgs("-o", "json", "grouped")...)
	var report preflight.Report
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("-o json does not parse: %v\n%s", err, out)
	}
	if len(report.Problems) != 4 {
		t.Errorf("-o json has %d problems, want one per object (4):\n%s", len(report.Problems), out)
	}
}

// Against a cluster, an object in a namespace the overlay creates cannot
// be dry-run: it is checked against the schema the cluster serves.
func TestValidateOnlineSchemaWhereNoDryRunGoes(t *testing.T) {
	kubeconfig := startGizmoCluster(t)
	out, err := runCLI(t, validateArgs("--kubeconfig", kubeconfig, "newns")...)
	if err == nil || !strings.Contains(err.Error(), "preflight found 1 error, 0 warnings") {
		t.Errorf("error = %v, want 1 error", err)
	}
	want := "ERROR ConfigMap validate-newns/settings: datas: schema check: the schema of v1 ConfigMap declares no such field; check its spelling and the apiVersion (in newns/objects.yaml)"
	if !strings.Contains(out, want+"\n") {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
}

package main

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// startManagementCluster starts a control plane with Capstan's, Cluster
// API's and Metal3's CRDs and no controllers.
func startManagementCluster(t *testing.T) *testenv.Env {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a control plane; not under -short")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	crds, err := testenv.ProviderCRDDirs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env, err := testenv.Start(ctx, testenv.Options{CRDDirs: append([]string{"../../manifests/crds"}, crds...), Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	return env
}

// pivotFixture is a deployment in the source: what it applied carries
// Capstan's labels; the Machine is the controllers' (owned by the
// Cluster); the ConfigMap is nobody's.
const pivotFixture = `
apiVersion: capstan.dev/v1alpha1
kind: ClusterDeployment
metadata: {name: mgmt, namespace: capstan-system}
spec: {path: clusters/mgmt, profile: capm3}
---
apiVersion: v1
kind: Secret
metadata: {name: mgmt-cp-0-bmc, namespace: mgmt, labels: {capstan.dev/name: mgmt, capstan.dev/namespace: capstan-system}}
stringData: {username: admin, password: s3cret}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {name: mgmt, namespace: mgmt, labels: {capstan.dev/name: mgmt, capstan.dev/namespace: capstan-system}}
spec: {infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: Metal3Cluster, name: mgmt}}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Machine
metadata: {name: mgmt-abcde, namespace: mgmt, labels: {cluster.x-k8s.io/cluster-name: mgmt}}
spec: {clusterName: mgmt, bootstrap: {dataSecretName: x}, infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: Metal3Machine, name: mgmt-abcde}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: unrelated, namespace: mgmt}
data: {a: b}
`

func writePivotFixture(t *testing.T, env *testenv.Env) client.Client {
	t.Helper()
	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	writeDeployment(t, c, "mgmt")
	return c
}

// writeDeployment writes pivotFixture for a deployment and cluster named
// name, its cluster's objects in namespace name.
func writeDeployment(t *testing.T, c client.Client, name string) {
	t.Helper()
	for _, ns := range []string{"capstan-system", name} {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}
		if err := c.Create(t.Context(), u); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, doc := range strings.Split(strings.ReplaceAll(pivotFixture, "mgmt", name), "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		if err := c.Create(t.Context(), u); err != nil {
			t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

// versions are the resource versions of the fixture's kinds in a cluster:
// any write changes one.
func versions(t *testing.T, c client.Client) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, kind := range []struct{ apiVersion, kind string }{
		{"capstan.dev/v1alpha1", "ClusterDeployment"}, {"v1", "Secret"}, {"v1", "ConfigMap"},
		{"cluster.x-k8s.io/v1beta2", "Cluster"}, {"cluster.x-k8s.io/v1beta2", "Machine"}, {"v1", "Namespace"},
	} {
		list := &unstructured.UnstructuredList{}
		list.SetAPIVersion(kind.apiVersion)
		list.SetKind(kind.kind + "List")
		if err := c.List(t.Context(), list); err != nil {
			t.Fatal(err)
		}
		for _, u := range list.Items {
			out[u.GetKind()+"/"+u.GetNamespace()+"/"+u.GetName()] = u.GetResourceVersion()
		}
	}
	return out
}

func TestPivotCommand(t *testing.T) {
	source, target := startManagementCluster(t), startManagementCluster(t)
	sc := writePivotFixture(t, source)
	tc, err := client.New(target.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"pivot", "mgmt", "--kubeconfig", source.KubeconfigPath, "--to-kubeconfig", target.KubeconfigPath}

	t.Run("--dry-run prints the plan and writes nothing", func(t *testing.T) {
		before, beforeTarget := versions(t, sc), versions(t, tc)
		out, err := runCLI(t, append(args, "--dry-run")...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, want := range []string{
			"1. Pause in the source (2): Cluster/mgmt/mgmt, ClusterDeployment/capstan-system/mgmt",
			"2. Create in the target, owners first (4):",
			"Secret/mgmt/mgmt-cp-0-bmc",
			"Machine/mgmt/mgmt-abcde",
			"labelled cluster.x-k8s.io/cluster-name=mgmt",
			"keep as paused read-only mirrors (3)",
			"delete, dependents first (1): Secret/mgmt/mgmt-cp-0-bmc",
			"Preflight: no problems; the move may start",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("plan does not say %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "unrelated") {
			t.Errorf("the plan moves ConfigMap unrelated, which is nobody's:\n%s", out)
		}
		if after := versions(t, sc); !maps.Equal(before, after) {
			t.Errorf("--dry-run wrote to the source: %v -> %v", before, after)
		}
		if after := versions(t, tc); !maps.Equal(beforeTarget, after) {
			t.Errorf("--dry-run wrote to the target: %v -> %v", beforeTarget, after)
		}
	})

	t.Run("-o yaml is the same plan as data", func(t *testing.T) {
		out, err := runCLI(t, append(args, "--dry-run", "-o", "yaml")...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var plan pivotPlan
		if err := yaml.UnmarshalStrict([]byte(out), &plan); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if len(plan.Create) != 4 || plan.Deployment != "capstan-system/mgmt" {
			t.Errorf("plan %+v", plan)
		}
		if plan.Preflight == nil || len(plan.Preflight) != 0 {
			t.Errorf("preflight %#v, want an empty list: it ran and found nothing", plan.Preflight)
		}
	})

	t.Run("a machine mid-provisioning: the dry run lists it and fails, the move is refused, --force passes", func(t *testing.T) {
		setMachinePhase(t, sc, "mgmt", "mgmt-abcde", "Provisioning")
		defer setMachinePhase(t, sc, "mgmt", "mgmt-abcde", "Running")
		before, beforeTarget := versions(t, sc), versions(t, tc)
		const problem = "Machine/mgmt/mgmt-abcde is Provisioning"

		out, err := runCLI(t, append(args, "--dry-run")...)
		if err == nil || !strings.Contains(err.Error(), "preflight found 1 problem") {
			t.Errorf("err %v, want the preflight's problem counted", err)
		}
		plan, problemAt := strings.Index(out, "4. In the source"), strings.Index(out, problem)
		if plan < 0 || problemAt < plan || !strings.Contains(out[problemAt:], "--force") {
			t.Errorf("the dry run does not list %q, with --force, after the plan:\n%s", problem, out)
		}

		out, err = runCLI(t, append(args, "--dry-run", "-o", "json")...)
		if err == nil {
			t.Error("-o json: the dry run passed")
		}
		var data pivotPlan
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&data); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if len(data.Preflight) != 1 || data.Preflight[0].Check != "NotMidOperation" ||
			!slices.Equal(data.Preflight[0].Objects, []string{"Machine/mgmt/mgmt-abcde"}) || !strings.Contains(data.Preflight[0].Message, problem) {
			t.Errorf("preflight %+v, want the machine's problem as data", data.Preflight)
		}

		out, err = runCLI(t, args...)
		if err == nil || !strings.Contains(err.Error(), "did not start") || !strings.Contains(err.Error(), problem) {
			t.Errorf("err %v, want the move refused naming the machine\n%s", err, out)
		}
		if after := versions(t, sc); !maps.Equal(before, after) {
			t.Errorf("the refused move wrote to the source: %v -> %v", before, after)
		}
		if after := versions(t, tc); !maps.Equal(beforeTarget, after) {
			t.Errorf("the refused move wrote to the target: %v -> %v", beforeTarget, after)
		}

		out, err = runCLI(t, append(args, "--dry-run", "--force")...)
		if err != nil || !strings.Contains(out, "Preflight: no problems") {
			t.Errorf("--force: %v\n%s", err, out)
		}
	})

	t.Run("the move, then again: moved already", func(t *testing.T) {
		out, err := runCLI(t, args...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, step := range []string{"Pause", "Copy", "Unpause", "CleanSource"} {
			if !strings.Contains(out, "✓ "+step) {
				t.Errorf("no progress line for step %s:\n%s", step, out)
			}
		}
		for _, name := range []string{"Secret/mgmt/mgmt-cp-0-bmc", "Cluster/mgmt/mgmt", "Machine/mgmt/mgmt-abcde", "ClusterDeployment/capstan-system/mgmt"} {
			if _, ok := versions(t, tc)[name]; !ok {
				t.Errorf("%s is not in the target", name)
			}
		}
		left := slices.Sorted(maps.Keys(versions(t, sc)))
		if slices.Contains(left, "Secret/mgmt/mgmt-cp-0-bmc") || !slices.Contains(left, "ConfigMap/mgmt/unrelated") {
			t.Errorf("the source keeps %v; want the BMC Secret gone and the unrelated ConfigMap kept", left)
		}
		out, err = runCLI(t, args...)
		if err != nil || !strings.Contains(out, "moved into") {
			t.Errorf("second run: %v\n%s", err, out)
		}
	})

	t.Run("a move into another cluster is refused while one is recorded", func(t *testing.T) {
		third := startManagementCluster(t)
		out, err := runCLI(t, "pivot", "mgmt", "--kubeconfig", source.KubeconfigPath, "--to-kubeconfig", third.KubeconfigPath)
		if err == nil || !strings.Contains(err.Error(), "is being moved into "+target.Config.Host) {
			t.Errorf("err %v, output:\n%s", err, out)
		}
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("cluster.x-k8s.io/v1beta2")
		u.SetKind("Cluster")
		c3, _ := client.New(third.Config, client.Options{})
		if err := c3.Get(t.Context(), client.ObjectKey{Namespace: "mgmt", Name: "mgmt"}, u); !apierrors.IsNotFound(err) {
			t.Errorf("the third cluster got Cluster mgmt (err %v)", err)
		}
	})

	// A move that resumes was checked when it started: no preflight,
	// though it would refuse the machine the deployment has now.
	t.Run("a move that resumes runs no preflight", func(t *testing.T) {
		writeDeployment(t, sc, "edge")
		setMachinePhase(t, sc, "edge", "edge-abcde", "Provisioning")
		args := []string{"pivot", "edge", "--kubeconfig", source.KubeconfigPath, "--to-kubeconfig", target.KubeconfigPath}
		if out, err := runCLI(t, append(args, "--dry-run")...); err == nil || !strings.Contains(out, "Machine/edge/edge-abcde is Provisioning") {
			t.Fatalf("the preflight of a new move passed a provisioning machine: %v\n%s", err, out)
		}
		// As a move interrupted after its first step leaves it.
		if err := recordStep(t.Context(), sc, "capstan-system", "edge", pivot.StepPause, target.Config.Host); err != nil {
			t.Fatal(err)
		}
		out, err := runCLI(t, append(args, "--dry-run", "-o", "yaml")...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var plan pivotPlan
		if err := yaml.UnmarshalStrict([]byte(out), &plan); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if plan.Preflight != nil || plan.ResumesAfter != "Pause" {
			t.Errorf("preflight %v, resumes after %q; want none run, after Pause", plan.Preflight, plan.ResumesAfter)
		}
		out, err = runCLI(t, args...)
		if err != nil || !strings.Contains(out, "resuming the move of capstan-system/edge") || !strings.Contains(out, "✓ CleanSource") {
			t.Errorf("%v\n%s", err, out)
		}
		if _, ok := versions(t, tc)["Machine/edge/edge-abcde"]; !ok {
			t.Error("Machine edge-abcde is not in the target")
		}
	})
}

// setMachinePhase writes a Machine's status.phase, as Cluster API would.
func setMachinePhase(t *testing.T, c client.Client, namespace, name, phase string) {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("cluster.x-k8s.io/v1beta2")
	u.SetKind("Machine")
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, u); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(u.Object, phase, "status", "phase"); err != nil {
		t.Fatal(err)
	}
	if err := c.Status().Update(t.Context(), u); err != nil {
		t.Fatal(err)
	}
}

func TestPivotNeedsATarget(t *testing.T) {
	_, err := runCLI(t, "pivot", "mgmt")
	if err == nil || !strings.Contains(err.Error(), "--to-kubeconfig is required") {
		t.Errorf("err %v", err)
	}
}

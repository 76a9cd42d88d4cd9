package main

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
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

	targetID, err := pivot.ClusterID(t.Context(), tc)
	if err != nil {
		t.Fatal(err)
	}
	intoTarget := "kubeconfig " + target.Config.Host
	third := startManagementCluster(t)
	intoThird := "kubeconfig " + third.Config.Host
	c3, err := client.New(third.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}

	var moved *capstanv1.PivotStatus
	t.Run("the move records each phase in status.pivot, hands the fencing records to the target and says what is next", func(t *testing.T) {
		// A pivot stage whose preflight failed leaves a record without a
		// phase: the move by hand replaces it whole.
		patchPivotRecord(t, sc, "mgmt", map[string]any{"target": "Secret capstan-system/mgmt-kubeconfig", "stage": "PivotDone", "message": "preflight failed"})
		out, err := runCLI(t, args...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, phase := range []string{"Preflight", "Pause", "Copy", "Unpause", "CleanSource"} {
			if !strings.Contains(out, "✓ "+phase) {
				t.Errorf("no progress line for phase %s:\n%s", phase, out)
			}
		}
		if !strings.Contains(out, "capstan install --kubeconfig "+target.KubeconfigPath) {
			t.Errorf("the output does not say to start Capstan in the target:\n%s", out)
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

		moved = pivotRecord(t, sc, "mgmt")
		if moved == nil {
			t.Fatal("no status.pivot in the source")
		}
		if moved.Phase != capstanv1.PivotSourceCleaned || moved.Target != intoTarget || moved.Stage != "" || moved.Message != "" ||
			moved.Objects != 4 || moved.Owner != targetID || moved.StartedAt == nil || moved.PhaseTime == nil {
			t.Errorf("status.pivot %+v; want phase CleanSource into %q by hand, 4 objects, owned by the target %s, timed", moved, intoTarget, targetID)
		}
		if want := []string{"Cluster/mgmt/mgmt", "Machine/mgmt/mgmt-abcde"}; !slices.Equal(mirrorNames(moved, ""), want) {
			t.Errorf("status.pivot.mirrors %v, want %v", mirrorNames(moved, ""), want)
		}
		// The target's kubeconfig is kept where the source's Capstan reads
		// it to refresh the mirrors, and it reaches the target.
		if k := moved.KubeConfig; k == nil || k.Name != "mgmt-target-kubeconfig" || k.Key != "value" || moved.KubeConfigNamespace != "capstan-system" {
			t.Errorf("status.pivot.kubeConfig %+v in %q, want Secret capstan-system/mgmt-target-kubeconfig, key value", k, moved.KubeConfigNamespace)
		} else {
			kept := &corev1.Secret{}
			if err := sc.Get(t.Context(), client.ObjectKey{Namespace: "capstan-system", Name: k.Name}, kept); err != nil {
				t.Fatal(err)
			}
			cfg, err := clientcmd.RESTConfigFromKubeConfig(kept.Data["value"])
			if err != nil {
				t.Fatalf("the kept kubeconfig: %v", err)
			}
			kc, err := client.New(cfg, client.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if id, err := pivot.ClusterID(t.Context(), kc); err != nil || id != targetID {
				t.Errorf("the kept kubeconfig reaches cluster %q (err %v), want the target %s", id, err, targetID)
			}
		}
		for name, c := range map[string]client.Client{"target": tc, "source": sc} {
			if holder, err := pivot.FenceHolder(t.Context(), c, "capstan-system", "mgmt"); err != nil || holder != targetID {
				t.Errorf("the fencing record in the %s names %q (err %v), want the target %s", name, holder, err, targetID)
			}
		}
		cd := deployment(t, sc, "mgmt")
		for _, old := range []string{"capstan.dev/pivot-step", "capstan.dev/pivot-target"} {
			if v, ok := cd.GetAnnotations()[old]; ok {
				t.Errorf("the source's deployment is annotated %s=%s", old, v)
			}
		}
		if there := deployment(t, tc, "mgmt"); there.Object["status"] != nil && there.Object["status"].(map[string]any)["pivot"] != nil {
			t.Errorf("the deployment in the target came with the source's status.pivot: %v", there.Object["status"])
		}
	})

	t.Run("run again: the move is complete and nothing is written", func(t *testing.T) {
		before, beforeTarget := versions(t, sc), versions(t, tc)
		out, err := runCLI(t, args...)
		if err != nil || !strings.Contains(out, "the move is complete") || !strings.Contains(out, "capstan install --kubeconfig") {
			t.Errorf("second run: %v\n%s", err, out)
		}
		if after := versions(t, sc); !maps.Equal(before, after) {
			t.Errorf("the second run wrote to the source: %v -> %v", before, after)
		}
		if after := versions(t, tc); !maps.Equal(beforeTarget, after) {
			t.Errorf("the second run wrote to the target: %v -> %v", beforeTarget, after)
		}
	})

	t.Run("a move into another cluster is refused, naming both, once the move is done", func(t *testing.T) {
		out, err := runCLI(t, "pivot", "mgmt", "--kubeconfig", source.KubeconfigPath, "--to-kubeconfig", third.KubeconfigPath)
		if err == nil || !strings.Contains(err.Error(), "was moved into "+intoTarget+" already") || !strings.Contains(err.Error(), "not "+intoThird) {
			t.Errorf("err %v, output:\n%s", err, out)
		}
		if !clusterAbsent(t, c3, "mgmt") {
			t.Error("the third cluster got Cluster mgmt")
		}
	})

	// A move stopped after a step (here by the command's own hook, as a
	// crash would) resumes from status.pivot: no preflight, though it
	// would refuse the machine the deployment has now, only the steps
	// left, and it ends with the record of an uninterrupted move.
	t.Run("an interrupted move resumes from status.pivot and ends as an uninterrupted one", func(t *testing.T) {
		writeDeployment(t, sc, "edge")
		f := pivotFlags{source: clusterFlags{kubeconfig: source.KubeconfigPath}, target: clusterFlags{kubeconfig: target.KubeconfigPath},
			namespace: "capstan-system", output: "text"}
		var out strings.Builder
		stop := func(s pivot.Step) error {
			if s == pivot.StepCopy {
				return errors.New("interrupted")
			}
			return nil
		}
		err := movePivot(t.Context(), &out, f, "edge", stop)
		if err == nil || !strings.Contains(err.Error(), "interrupted") || !strings.Contains(err.Error(), "run the same command again to resume") {
			t.Fatalf("err %v\n%s", err, out.String())
		}
		if !strings.Contains(out.String(), "✓ Copy") || strings.Contains(out.String(), "✓ Unpause") {
			t.Errorf("the interrupted move went on after Copy:\n%s", out.String())
		}
		stopped := pivotRecord(t, sc, "edge")
		if stopped == nil || stopped.Phase != capstanv1.PivotCopied || stopped.Target != intoTarget || stopped.Owner != "" || stopped.Objects != 0 {
			t.Fatalf("status.pivot %+v, want phase Copy into %q, not owned yet", stopped, intoTarget)
		}
		if holder, err := pivot.FenceHolder(t.Context(), tc, "capstan-system", "edge"); err != nil || holder != "" {
			t.Errorf("the fencing record in the target names %q (err %v) before Unpause", holder, err)
		}

		out2, err := runCLI(t, "pivot", "edge", "--kubeconfig", source.KubeconfigPath, "--to-kubeconfig", third.KubeconfigPath)
		if err == nil || !strings.Contains(err.Error(), "is being moved into "+intoTarget+" (phase Copy done), not "+intoThird) {
			t.Errorf("a move into the third cluster during the move: err %v\n%s", err, out2)
		}
		if !clusterAbsent(t, c3, "edge") {
			t.Error("the third cluster got Cluster edge")
		}

		setMachinePhase(t, tc, "edge", "edge-abcde", "Provisioning")
		before, beforeTarget := versions(t, sc), versions(t, tc)
		resume := []string{"pivot", "edge", "--kubeconfig", source.KubeconfigPath, "--to-kubeconfig", target.KubeconfigPath}
		out2, err = runCLI(t, append(resume, "--dry-run", "-o", "yaml")...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out2)
		}
		var plan pivotPlan
		if err := yaml.UnmarshalStrict([]byte(out2), &plan); err != nil {
			t.Fatalf("%v\n%s", err, out2)
		}
		if plan.Preflight != nil || plan.ResumesAfter != "Copy" {
			t.Errorf("preflight %v, resumes after %q; want none run, after Copy", plan.Preflight, plan.ResumesAfter)
		}
		if after := versions(t, sc); !maps.Equal(before, after) {
			t.Errorf("the dry run of the resumed move wrote to the source: %v -> %v", before, after)
		}
		if after := versions(t, tc); !maps.Equal(beforeTarget, after) {
			t.Errorf("the dry run of the resumed move wrote to the target: %v -> %v", beforeTarget, after)
		}

		out2, err = runCLI(t, resume...)
		if err != nil || !strings.Contains(out2, "resuming the move of capstan-system/edge into "+intoTarget+" after phase Copy") {
			t.Fatalf("%v\n%s", err, out2)
		}
		for phase, want := range map[string]bool{"Preflight": false, "Pause": false, "Copy": false, "Unpause": true, "CleanSource": true} {
			if strings.Contains(out2, "✓ "+phase) != want {
				t.Errorf("progress line for phase %s: %t, want %t\n%s", phase, !want, want, out2)
			}
		}
		got := pivotRecord(t, sc, "edge")
		if moved == nil || got == nil {
			t.Fatalf("status.pivot %+v, uninterrupted %+v", got, moved)
		}
		if got.Phase != moved.Phase || got.Target != moved.Target || got.Stage != moved.Stage || got.Objects != moved.Objects || got.Owner != moved.Owner ||
			!got.StartedAt.Equal(stopped.StartedAt) || !slices.Equal(mirrorNames(got, "edge"), mirrorNames(moved, "")) {
			t.Errorf("status.pivot after the resumed move %+v,\nwant as the uninterrupted one %+v, started when the move started", got, moved)
		}
		if holder, err := pivot.FenceHolder(t.Context(), tc, "capstan-system", "edge"); err != nil || holder != targetID {
			t.Errorf("the fencing record in the target names %q (err %v), want the target %s", holder, err, targetID)
		}
		if _, ok := versions(t, tc)["Machine/edge/edge-abcde"]; !ok {
			t.Error("Machine edge-abcde is not in the target")
		}
	})
}

// deployment reads ClusterDeployment capstan-system/name.
func deployment(t *testing.T, c client.Client, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(capstanv1.GroupVersion.WithKind("ClusterDeployment"))
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: "capstan-system", Name: name}, u); err != nil {
		t.Fatal(err)
	}
	return u
}

// pivotRecord reads the status.pivot of ClusterDeployment
// capstan-system/name.
func pivotRecord(t *testing.T, c client.Client, name string) *capstanv1.PivotStatus {
	t.Helper()
	cd := &capstanv1.ClusterDeployment{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(deployment(t, c, name).Object, cd); err != nil {
		t.Fatal(err)
	}
	return cd.Status.Pivot
}

// patchPivotRecord merges fields into the status.pivot of
// ClusterDeployment capstan-system/name, as a pivot stage would.
func patchPivotRecord(t *testing.T, c client.Client, name string, fields map[string]any) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"pivot": fields}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Status().Patch(t.Context(), deployment(t, c, name), client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
}

// mirrorNames are a record's mirrors as Kind/namespace/name, sorted; the
// name rename, when given, reads as mgmt (to compare two deployments).
func mirrorNames(st *capstanv1.PivotStatus, rename string) []string {
	var out []string
	for _, m := range st.Mirrors {
		name := m.Kind + "/" + m.Namespace + "/" + m.Name
		if rename != "" {
			name = strings.ReplaceAll(name, rename, "mgmt")
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// clusterAbsent reports whether the cluster c reaches has no Cluster
// name/name.
func clusterAbsent(t *testing.T, c client.Client, name string) bool {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("cluster.x-k8s.io/v1beta2")
	u.SetKind("Cluster")
	err := c.Get(t.Context(), client.ObjectKey{Namespace: name, Name: name}, u)
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return apierrors.IsNotFound(err)
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

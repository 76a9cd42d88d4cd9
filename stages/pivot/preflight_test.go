package pivot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// preflightCase is the fixture of move_test.go in the source, changed by
// setup, checked against the target of TestMain.
type preflightCase struct {
	name  string
	setup func(t *testing.T, source, target client.Client, ns string)
	// want are the checks that find a problem, in the order Preflight
	// reports them, and a phrase each problem's message must hold.
	want []wantProblem
}

type wantProblem struct {
	check  PreflightCheck
	phrase string // with {ns} for the fixture's namespace
}

var preflightCases = []preflightCase{
	{name: "a clean move passes"},
	{name: "a host being inspected is refused",
		setup: hostState("inspecting"),
		want:  []wantProblem{{PreflightNotMidOperation, "BareMetalHost/{ns}/mgmt-cp-0 is inspecting"}}},
	{name: "a host being registered is refused",
		setup: hostState("registering"),
		want:  []wantProblem{{PreflightNotMidOperation, "BareMetalHost/{ns}/mgmt-cp-0 is registering"}}},
	{name: "a host being provisioned is refused",
		setup: hostState("provisioning"),
		want:  []wantProblem{{PreflightNotMidOperation, "BareMetalHost/{ns}/mgmt-cp-0 is provisioning"}}},
	{name: "a host being deprovisioned is refused",
		setup: hostState("deprovisioning"),
		want:  []wantProblem{{PreflightNotMidOperation, "BareMetalHost/{ns}/mgmt-cp-0 is deprovisioning"}}},
	{name: "a host powering off before delete is refused",
		setup: hostState("powering off before delete"),
		want:  []wantProblem{{PreflightNotMidOperation, `BareMetalHost/{ns}/mgmt-cp-0 is "powering off before delete"`}}},
	{name: "an available host moves", setup: hostState("available")},
	{name: "an externally provisioned host moves", setup: hostState("externally provisioned")},
	{name: "a provisioning machine is refused",
		setup: machinePhase("Provisioning"),
		want:  []wantProblem{{PreflightNotMidOperation, "Machine/{ns}/mgmt-abcde is Provisioning"}}},
	{name: "a pending machine is refused",
		setup: machinePhase("Pending"),
		want:  []wantProblem{{PreflightNotMidOperation, "Machine/{ns}/mgmt-abcde is Pending"}}},
	{name: "a provisioned machine moves", setup: machinePhase("Provisioned")},
	{name: "a Secret being deleted is refused, --force or not",
		setup: deleting("v1", "Secret", "mgmt-kubeconfig"),
		want:  []wantProblem{{PreflightNotBeingDeleted, "Secret/{ns}/mgmt-kubeconfig is being deleted"}}},
	{name: "a machine being deleted is one problem, --force or not",
		setup: func(t *testing.T, source, target client.Client, ns string) {
			machinePhase("Deleting")(t, source, target, ns)
			deleting("cluster.x-k8s.io/v1beta2", "Machine", "mgmt-abcde")(t, source, target, ns)
		},
		want: []wantProblem{{PreflightNotBeingDeleted, "Machine/{ns}/mgmt-abcde is being deleted (since "}}},
	{name: "a deployment the target has and no move created is refused",
		setup: deploymentInTarget(nil),
		want:  []wantProblem{{PreflightNoDeploymentInTarget, "ClusterDeployment/{ns}/mgmt exists in the target already and no move created it"}}},
	{name: "a deployment that arrived in the target by a move is not a problem",
		setup: deploymentInTarget(map[string]string{ArrivedAnnotation: "bootstrap"})},
}

// TestPreflight checks each case twice: as it is, and with Force, which
// lifts the problems of machines and hosts mid-operation and no other.
func TestPreflight(t *testing.T) {
	source, target := clients(t)
	disco := discoveryOf(t, targetEnv.Config)
	for _, tc := range preflightCases {
		t.Run(tc.name, func(t *testing.T) {
			ns, roots := writeFixture(t, source)
			if tc.setup != nil {
				tc.setup(t, source, target, ns)
			}
			g := graphAt(t, source, target, ns, roots, "")
			err := Preflight(t.Context(), g, target, disco, PreflightOptions{})
			assertProblems(t, err, tc.want, ns)

			var forced []wantProblem
			for _, w := range tc.want {
				if w.check != PreflightNotMidOperation {
					forced = append(forced, w)
				}
			}
			err = Preflight(t.Context(), g, target, disco, PreflightOptions{Force: true})
			assertProblems(t, err, forced, ns)
		})
	}
}

// assertProblems checks that err joins exactly the problems of want, in
// order, and that each one a user may override says how.
func assertProblems(t *testing.T, err error, want []wantProblem, ns string) {
	t.Helper()
	got := PreflightProblems(err)
	if len(want) == 0 {
		if err != nil {
			t.Errorf("Preflight = %v, want nil", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("Preflight passed; want %d problems", len(want))
	}
	var checks, wantChecks []PreflightCheck
	for _, p := range got {
		checks = append(checks, p.Check)
	}
	for _, w := range want {
		wantChecks = append(wantChecks, w.check)
	}
	if !slices.Equal(checks, wantChecks) {
		t.Fatalf("problems of checks %v, want %v:\n%v", checks, wantChecks, err)
	}
	for i, w := range want {
		phrase := strings.ReplaceAll(w.phrase, "{ns}", ns)
		if !strings.Contains(got[i].Message, phrase) {
			t.Errorf("problem %d %q does not say %q", i, got[i].Message, phrase)
		}
		if !strings.Contains(err.Error(), got[i].Message) {
			t.Errorf("the joined error does not hold problem %d:\n%v", i, err)
		}
		if w.check == PreflightNotMidOperation && !strings.Contains(got[i].Message, "--force (pivot: {force: true}") {
			t.Errorf("problem %q does not say that --force overrides it", got[i].Message)
		}
	}
}

func hostState(state string) func(*testing.T, client.Client, client.Client, string) {
	return func(t *testing.T, source, _ client.Client, ns string) {
		t.Helper()
		setStatus(t, source, "metal3.io/v1alpha1", "BareMetalHost", ns, "mgmt-cp-0", state, "status", "provisioning", "state")
	}
}

func machinePhase(phase string) func(*testing.T, client.Client, client.Client, string) {
	return func(t *testing.T, source, _ client.Client, ns string) {
		t.Helper()
		setStatus(t, source, "cluster.x-k8s.io/v1beta2", "Machine", ns, "mgmt-abcde", phase, "status", "phase")
	}
}

// deleting deletes an object of the source held by a finalizer, so that
// it stays, being deleted, as when a controller has yet to let it go.
func deleting(apiVersion, kind, name string) func(*testing.T, client.Client, client.Client, string) {
	return func(t *testing.T, source, _ client.Client, ns string) {
		t.Helper()
		u := get(t, source, apiVersion, kind, ns, name)
		u.SetFinalizers(append(u.GetFinalizers(), "example.com/hold"))
		if err := source.Update(t.Context(), u); err != nil {
			t.Fatal(err)
		}
		if err := source.Delete(t.Context(), u); err != nil {
			t.Fatal(err)
		}
	}
}

// deploymentInTarget creates ClusterDeployment mgmt in the target, with
// annotations.
func deploymentInTarget(annotations map[string]string) func(*testing.T, client.Client, client.Client, string) {
	return func(t *testing.T, _, target client.Client, ns string) {
		t.Helper()
		if err := ensureNamespace(t.Context(), target, ns); err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(fixture[0].doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		u.SetNamespace(ns)
		u.SetAnnotations(annotations)
		if err := target.Create(t.Context(), u); err != nil {
			t.Fatal(err)
		}
	}
}

func get(t *testing.T, c client.Client, apiVersion, kind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, u); err != nil {
		t.Fatal(err)
	}
	return u
}

func setStatus(t *testing.T, c client.Client, apiVersion, kind, ns, name, value string, path ...string) {
	t.Helper()
	u := get(t, c, apiVersion, kind, ns, name)
	if err := unstructured.SetNestedField(u.Object, value, path...); err != nil {
		t.Fatal(err)
	}
	if err := c.Status().Update(t.Context(), u); err != nil {
		t.Fatalf("status of %s: %v", ObjectOf(u), err)
	}
}

func discoveryOf(t *testing.T, cfg *rest.Config) discovery.DiscoveryInterface {
	t.Helper()
	d, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// startTargetWithoutMetal3 starts a control plane as a target where only
// Capstan, Cluster API and an older CAPM3 were installed: no BareMetal
// Operator, and the CAPM3 kinds in v1beta1 only (the real CRDs, their
// v1beta2 left out), while the source serves them in v1beta2.
func startTargetWithoutMetal3(t *testing.T) *testenv.Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	dirs, err := testenv.ProviderCRDDirs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	crds := []string{"../../manifests/crds"}
	older := t.TempDir()
	for _, dir := range dirs {
		switch {
		case strings.Contains(dir, "cluster-api-provider-metal3@"):
			writeV1beta1Only(t, dir, older)
			crds = append(crds, older)
		case strings.Contains(dir, filepath.FromSlash("sigs.k8s.io/cluster-api@")):
			crds = append(crds, dir)
		}
	}
	if len(crds) != 5 {
		t.Fatalf("CRD folders %v: want Capstan's, three of Cluster API and the older CAPM3 (from %v)", crds, dirs)
	}
	env, err := testenv.Start(ctx, testenv.Options{CRDDirs: crds, Progress: os.Stderr})
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

// writeV1beta1Only writes the CRDs of dir into out with only their v1beta1
// version, stored, as a CAPM3 release before v1beta2 served them.
func writeV1beta1Only(t *testing.T, dir, out string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("CRDs in %s: %v", dir, err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crd := map[string]any{}
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			t.Fatal(err)
		}
		versions, _, _ := unstructured.NestedSlice(crd, "spec", "versions")
		var kept []any
		for _, v := range versions {
			m := v.(map[string]any)
			if m["name"] == "v1beta1" {
				m["storage"] = true
				delete(m, "deprecated")
				delete(m, "deprecationWarning")
				kept = append(kept, m)
			}
		}
		if len(kept) != 1 {
			t.Fatalf("%s has no version v1beta1", f)
		}
		if err := unstructured.SetNestedSlice(crd, kept, "spec", "versions"); err != nil {
			t.Fatal(err)
		}
		raw, err = yaml.Marshal(crd)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, filepath.Base(f)), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPreflightTargetWithoutMetal3 moves the fixture, with a second host,
// into a target that lacks the BareMetal Operator and serves the CAPM3
// kinds in v1beta1 only.
func TestPreflightTargetWithoutMetal3(t *testing.T) {
	env := startTargetWithoutMetal3(t)
	target, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	disco := discoveryOf(t, env.Config)
	source, _ := clients(t)

	// writeHosts is the fixture with a second host: two hosts, one problem.
	writeHosts := func(t *testing.T) (string, []Object) {
		ns, roots := writeFixture(t, source)
		host := get(t, source, "metal3.io/v1alpha1", "BareMetalHost", ns, "mgmt-cp-0")
		second := &unstructured.Unstructured{Object: map[string]any{"spec": host.Object["spec"]}}
		second.SetAPIVersion(host.GetAPIVersion())
		second.SetKind(host.GetKind())
		second.SetNamespace(ns)
		second.SetName("mgmt-cp-1")
		if err := source.Create(t.Context(), second); err != nil {
			t.Fatal(err)
		}
		return ns, append(roots, ObjectOf(second))
	}
	notServed := []wantProblem{
		{PreflightKindsServed, "BareMetalHost (metal3.io/v1alpha1, 2 objects: {ns}/mgmt-cp-0, {ns}/mgmt-cp-1): the target serves no version of metal3.io; install the provider's CRDs there first"},
		{PreflightKindsServed, "Metal3Cluster (infrastructure.cluster.x-k8s.io/v1beta2, 1 object: {ns}/mgmt): the target serves infrastructure.cluster.x-k8s.io/v1beta1 only; install the provider's CRDs there first"},
		{PreflightKindsServed, "Metal3Machine (infrastructure.cluster.x-k8s.io/v1beta2, 1 object: {ns}/mgmt-abcde): the target serves infrastructure.cluster.x-k8s.io/v1beta1 only"},
	}

	t.Run("one problem per kind the target does not serve, naming what it serves", func(t *testing.T) {
		ns, roots := writeHosts(t)
		g := graphAt(t, source, target, ns, roots, "")
		err := Preflight(t.Context(), g, target, disco, PreflightOptions{Force: true})
		assertProblems(t, err, notServed, ns)
		for _, p := range PreflightProblems(err) {
			if p.Waiting() {
				t.Errorf("%q is waiting; a missing CRD needs someone to install it", p.Message)
			}
		}
		if got := PreflightProblems(err)[0].Objects; len(got) != 2 {
			t.Errorf("the BareMetalHost problem concerns %v, want both hosts", got)
		}
	})

	t.Run("every problem at once", func(t *testing.T) {
		ns, roots := writeHosts(t)
		hostState("inspecting")(t, source, target, ns)
		machinePhase("Provisioning")(t, source, target, ns)
		deleting("v1", "Secret", "mgmt-kubeconfig")(t, source, target, ns)
		deploymentInTarget(nil)(t, source, target, ns)
		g := graphAt(t, source, target, ns, roots, "")
		err := Preflight(t.Context(), g, target, disco, PreflightOptions{})
		assertProblems(t, err, append(slices.Clone(notServed),
			wantProblem{PreflightNotMidOperation, "BareMetalHost/{ns}/mgmt-cp-0 is inspecting"},
			wantProblem{PreflightNotMidOperation, "Machine/{ns}/mgmt-abcde is Provisioning"},
			wantProblem{PreflightNotBeingDeleted, "Secret/{ns}/mgmt-kubeconfig is being deleted"},
			wantProblem{PreflightNoDeploymentInTarget, "ClusterDeployment/{ns}/mgmt exists in the target already"},
		), ns)
		var pp *PreflightProblem
		if !errors.As(err, &pp) {
			t.Errorf("errors.As finds no PreflightProblem in %v", err)
		}
	})
}

// TestPreflightUnreachableTarget points the target at a closed port: one
// problem says so, and the checks that need the target are skipped.
func TestPreflightUnreachableTarget(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(targetEnv.Config)
	cfg.Host = "https://" + closed
	target, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	source, _ := clients(t)
	ns, roots := writeFixture(t, source)
	g := graphAt(t, source, nil, ns, roots, "")

	err = Preflight(t.Context(), g, target, discoveryOf(t, cfg), PreflightOptions{})
	assertProblems(t, err, []wantProblem{{PreflightTargetReachable, "the target cannot be reached"}}, ns)
	if !strings.Contains(err.Error(), closed) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("the problem does not name the address and why: %v", err)
	}
	if p := PreflightProblems(err); len(p) == 1 && !p[0].Waiting() {
		t.Errorf("an unreachable target is not waiting: %v", p[0])
	}
}

func TestPreflightProblemsOfAnotherError(t *testing.T) {
	inner := &PreflightProblem{Check: PreflightKindsServed, Message: "m"}
	err := fmt.Errorf("stage PivotDone: %w", errors.Join(errors.New("other"), inner))
	if got := PreflightProblems(err); len(got) != 1 || got[0] != inner {
		t.Errorf("PreflightProblems = %v, want the one wrapped", got)
	}
	if got := PreflightProblems(nil); got != nil {
		t.Errorf("PreflightProblems(nil) = %v", got)
	}
}

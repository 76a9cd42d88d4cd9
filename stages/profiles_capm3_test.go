package stages_test

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/stages"
)

// The fixture: a Metal3 management cluster as an operator commits it.
const capm3Fixture = "capm3/cluster.yaml"

// installProviderCRDs installs the real Cluster API and Metal3 CRDs (the
// versions e2e/crds/go.mod pins) into the package's control plane, once.
var installProviderCRDs = sync.OnceValue(func() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dirs, err := testenv.ProviderCRDDirs(ctx)
	if err != nil {
		return err
	}
	return testenv.InstallCRDs(ctx, env.Config, dirs...)
})

// providerNamespace returns a namespace of a control plane that serves the
// provider CRDs, or skips the test under -short.
func providerNamespace(t *testing.T) string {
	t.Helper()
	if env == nil {
		t.Skip("needs the test control plane; not started under -short")
	}
	if err := installProviderCRDs(); err != nil {
		t.Fatalf("install provider CRDs: %v", err)
	}
	return newNamespace(t)
}

func mustProfile(t *testing.T, name string) *stages.Profile {
	t.Helper()
	p, err := stages.LoadProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func stageSpec(t *testing.T, p *stages.Profile, name string) capstanv1.StageSpec {
	t.Helper()
	for _, s := range p.Stages {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("profile %s has no stage %s", p.Name, name)
	return capstanv1.StageSpec{}
}

// TestBuiltInProfilesOrderAndChecks pins the stages of the lifecycle
// profiles as the seeds give them, and that every profile parses strictly,
// compiles, explains each check, and checks only kinds its stage holds.
func TestBuiltInProfilesOrderAndChecks(t *testing.T) {
	want := map[string][]string{
		"capm3": {
			"Preflight(validate)", "HostsRegistered(apply)", "InfrastructureReady(apply)", "ControlPlaneInitialized(apply)",
			"ControlPlaneReady(wait)", "WorkersReady(apply)", "ClusterReady(wait)",
		},
		"bootstrap": {
			"ProxySettingsHandled(validate)", "ClusterSSHConfigured(apply)", "ProviderUpdatedInBootstrap(apply)",
			"ProviderEnabledInBootstrap(scale)", "NodesReady(apply)", "ObjectsCreated(apply)",
			"ProviderConfigured(apply)", "HelmBundleReady(apply)", "ControllersDisabledBeforePivot(scale)",
			"PivotDone(pivot)", "ControllersEnabledAfterPivot(scale)", "MachinesLCMAgentUpdated(rollout)",
			"HelmControllerDisabledBeforeConfig(scale)", "HelmControllerConfigUpdated(apply)",
			"HelmControllerEnabledAfterConfig(scale)", "ClusterReady(wait)",
		},
	}
	for name, stageNames := range want {
		if got := names(mustProfile(t, name).Stages); got != strings.Join(stageNames, ", ") {
			t.Errorf("profile %s stages:\n got %s\nwant %s", name, got, strings.Join(stageNames, ", "))
		}
	}
	for _, name := range stages.Profiles() {
		p := mustProfile(t, name) // strict: an unknown field fails
		for _, s := range p.Stages {
			if _, err := stages.NewChecker(s.ReadyWhen); err != nil {
				t.Errorf("%s/%s: %v", name, s.Name, err)
			}
			for i, c := range s.ReadyWhen {
				if c.Message == "" {
					t.Errorf("%s/%s readyWhen[%d] has no message", name, s.Name, i)
				}
				if c.Kind != "" && len(s.Select.Kinds) > 0 && !slices.Contains(s.Select.Kinds, c.Kind) {
					t.Errorf("%s/%s readyWhen[%d] checks %s, which the stage does not select (%v)", name, s.Name, i, c.Kind, s.Select.Kinds)
				}
			}
		}
	}
}

// plannedObjects lists each stage's objects as Kind/name, sorted, leaving
// out the stages that hold none.
func plannedObjects(plan *stages.Plan) map[string][]string {
	out := map[string][]string{}
	for _, s := range plan.Stages {
		for _, o := range s.Objects {
			out[s.Name] = append(out[s.Name], o.GetKind()+"/"+o.GetName())
		}
		sort.Strings(out[s.Name])
	}
	return out
}

func hostsAndSecrets() []string {
	var out []string
	for _, h := range []string{"mgmt-cp-0", "mgmt-cp-1", "mgmt-cp-2", "mgmt-worker-0", "mgmt-worker-1"} {
		out = append(out, "BareMetalHost/"+h, "Secret/"+h+"-bmc")
	}
	sort.Strings(out)
	return out
}

// TestCAPM3PlanPlacesEveryObject: every object of a rendered Metal3
// cluster lands in the stage seed 002 builds it in.
func TestCAPM3PlanPlacesEveryObject(t *testing.T) {
	objs := append(loadObjects(t, capm3Fixture, "mgmt"), object("v1", "Namespace", "", "mgmt"))
	plan, err := stages.BuildPlan(mustProfile(t, "capm3").Stages, objs)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"Preflight":           {"Cluster/mgmt", "IPPool/mgmt-provisioning"},
		"HostsRegistered":     append(hostsAndSecrets(), "Namespace/mgmt"),
		"InfrastructureReady": {"Cluster/mgmt", "IPPool/mgmt-provisioning", "Metal3Cluster/mgmt"},
		"ControlPlaneInitialized": {
			"KubeadmConfigTemplate/mgmt-workers", "KubeadmControlPlane/mgmt", "Metal3DataTemplate/mgmt-nodes",
			"Metal3MachineTemplate/mgmt-controlplane", "Metal3MachineTemplate/mgmt-workers",
		},
		"ControlPlaneReady": {"KubeadmControlPlane/mgmt"},
		"WorkersReady":      {"MachineDeployment/mgmt-workers"},
		"ClusterReady":      {"Cluster/mgmt"},
	}
	sort.Strings(want["HostsRegistered"])
	comparePlans(t, plannedObjects(plan), want)
}

func comparePlans(t *testing.T, got, want map[string][]string) {
	t.Helper()
	for stage := range mergeKeys(got, want) {
		if g, w := strings.Join(got[stage], " "), strings.Join(want[stage], " "); g != w {
			t.Errorf("stage %s:\n got %s\nwant %s", stage, g, w)
		}
	}
}

func mergeKeys(a, b map[string][]string) map[string]bool {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	return keys
}

// fixtureObject returns a copy of the fixture's object kind/name in ns.
func fixtureObject(t *testing.T, ns, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range loadObjects(t, capm3Fixture, ns) {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("%s has no %s/%s", capm3Fixture, kind, name)
	return nil
}

// providerStep is one write a controller (or a user) makes: a status
// (merge patch of the status subresource) or a spec change.
type providerStep struct {
	status map[string]any
	spec   string // JSON merge patch; a spec change moves metadata.generation on
}

func statusStep(status map[string]any) providerStep { return providerStep{status: status} }
func specStep(patch string) providerStep            { return providerStep{spec: patch} }

// play writes the steps to the live object and returns it as read back.
func play(t *testing.T, c client.Client, obj *unstructured.Unstructured, steps ...providerStep) *unstructured.Unstructured {
	t.Helper()
	ctx := testContext(t)
	for _, s := range steps {
		var err error
		target := obj.DeepCopy()
		if s.status != nil {
			data, merr := json.Marshal(map[string]any{"status": s.status})
			if merr != nil {
				t.Fatal(merr)
			}
			err = c.Status().Patch(ctx, target, client.RawPatch(types.MergePatchType, data))
		} else {
			err = c.Patch(ctx, target, client.RawPatch(types.MergePatchType, []byte(s.spec)))
		}
		if err != nil {
			t.Fatalf("write %s: %v", stages.ObjectRef(obj), err)
		}
	}
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(obj.GroupVersionKind())
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), live); err != nil {
		t.Fatal(err)
	}
	return live
}

// condition is a metav1.Condition as the Cluster API and Metal3
// controllers write it: observedGeneration is the object's generation
// when it was set.
func condition(typ string, ok bool, generation int64) map[string]any {
	status, reason := "True", typ
	if !ok {
		status, reason = "False", "Not"+typ
	}
	return map[string]any{
		"type": typ, "status": status, "reason": reason, "message": "",
		"lastTransitionTime": "2026-01-02T03:04:05Z", "observedGeneration": generation,
	}
}

func conditions(c ...map[string]any) []any {
	out := make([]any, len(c))
	for i := range c {
		out[i] = c[i]
	}
	return out
}

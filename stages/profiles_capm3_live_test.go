package stages_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// The statuses below are written as the real controllers of the pinned
// versions write them (field names from their CRDs, conditions as
// sigs.k8s.io/cluster-api/util/conditions sets them), at the steps of
// seed 002.

// hostStatus is a BareMetalHost as the BareMetal Operator leaves it in a
// provisioning state, with the conditions it computes for that state.
func hostStatus(state, operational string, generation int64) map[string]any {
	registered := state != "registering"
	return map[string]any{
		"operationalStatus": operational,
		"errorCount":        0,
		"errorMessage":      "",
		"poweredOn":         state == "provisioned",
		"provisioning":      map[string]any{"ID": "8a5e3f0c-1b2d-4c6e-9f00-0123456789ab", "state": state, "bootMode": "UEFI"},
		"conditions": conditions(
			condition("Manageable", registered, generation),
			condition("AvailableForProvisioning", state == "available", generation),
			condition("Provisioned", state == "provisioned", generation),
		),
	}
}

// clusterStatus is a v1beta2 Cluster as the Cluster controller writes it:
// step 0 waits for the Metal3Cluster, 1 has its infrastructure, 2 has an
// initialized control plane it cannot reach yet, 3 is Available.
func clusterStatus(step int, generation int64) map[string]any {
	phase := "Provisioning"
	if step >= 2 {
		phase = "Provisioned"
	}
	return map[string]any{
		"observedGeneration": generation,
		"phase":              phase,
		"initialization":     map[string]any{"infrastructureProvisioned": step >= 1, "controlPlaneInitialized": step >= 2},
		"conditions": conditions(
			condition("Available", step >= 3, generation),
			condition("ControlPlaneInitialized", step >= 2, generation),
			condition("InfrastructureReady", step >= 1, generation),
			condition("RemoteConnectionProbe", step >= 3, generation),
		),
	}
}

// metal3ClusterStatus is a v1beta2 Metal3Cluster as CAPM3 writes it.
func metal3ClusterStatus(provisioned bool, generation int64) map[string]any {
	return map[string]any{
		"initialization": map[string]any{"provisioned": provisioned},
		"lastUpdated":    "2026-01-02T03:04:05Z",
		"conditions": conditions(
			condition("Ready", provisioned, generation),
			condition("BaremetalInfrastructureReady", provisioned, generation),
		),
	}
}

// replicaStatus is the status of a KubeadmControlPlane or MachineDeployment
// (v1beta2) with machines at the given versions (version -> count).
func replicaStatus(generation, replicas, upToDate, ready int64, versions map[string]int64, available bool) map[string]any {
	var vs []any
	for v, n := range versions {
		vs = append(vs, map[string]any{"version": v, "replicas": n})
	}
	s := map[string]any{
		"observedGeneration": generation,
		"replicas":           replicas,
		"upToDateReplicas":   upToDate,
		"readyReplicas":      ready,
		"availableReplicas":  ready,
		"conditions":         conditions(condition("Available", available, generation)),
	}
	if len(vs) > 0 {
		s["versions"] = vs
	}
	return s
}

// kcpStatus adds what the KubeadmControlPlane controller writes once the
// first machine serves the API.
func kcpStatus(s map[string]any, initialized bool) map[string]any {
	s["initialization"] = map[string]any{"controlPlaneInitialized": initialized}
	g := s["observedGeneration"].(int64)
	s["conditions"] = append(s["conditions"].([]any), condition("Initialized", initialized, g))
	return s
}

// verdictCases pin the capm3 profile's checks on objects of the real CRDs,
// at the steps the controllers go through.
var verdictCases = []struct {
	name        string
	stage       string
	kind, obj   string                                     // the fixture object
	object      func(ns string) *unstructured.Unstructured // instead of the fixture's
	steps       []providerStep
	wantReady   bool
	wantMessage string
}{
	{name: "a host the BareMetal Operator has not seen is not registered", stage: "HostsRegistered", kind: "BareMetalHost", obj: "mgmt-cp-0",
		wantMessage: "register and inspect"},
	{name: "a host being inspected is not registered, and says its state", stage: "HostsRegistered", kind: "BareMetalHost", obj: "mgmt-cp-0",
		steps:       []providerStep{statusStep(hostStatus("inspecting", "OK", 1))},
		wantMessage: "waiting for the BareMetal Operator to register and inspect the host (status.provisioning.state available): state inspecting"},
	{name: "a host the operator cannot register carries the operator's error", stage: "HostsRegistered", kind: "BareMetalHost", obj: "mgmt-cp-0",
		steps: []providerStep{statusStep(func() map[string]any {
			// As BMO's demo provisioner leaves a host named
			// demo-registration-error.
			s := hostStatus("registering", "error", 1)
			s["errorType"], s["errorMessage"], s["errorCount"] = "registration error", "failed to register new host", 4
			return s
		}())},
		wantMessage: "waiting for the BareMetal Operator to register and inspect the host (status.provisioning.state available): state registering, registration error: failed to register new host"},
	{name: "an available host is registered", stage: "HostsRegistered", kind: "BareMetalHost", obj: "mgmt-cp-0",
		steps: []providerStep{statusStep(hostStatus("available", "OK", 1))}, wantReady: true},
	{name: "a provisioned host is registered (the plan walked again later)", stage: "HostsRegistered", kind: "BareMetalHost", obj: "mgmt-cp-0",
		steps: []providerStep{statusStep(hostStatus("provisioned", "OK", 1))}, wantReady: true},
	{name: "a host whose BMC fails is not ready", stage: "HostsRegistered", kind: "BareMetalHost", obj: "mgmt-cp-0",
		steps: []providerStep{statusStep(func() map[string]any {
			s := hostStatus("available", "error", 1)
			s["errorType"], s["errorMessage"], s["errorCount"] = "power management error", "BMC unreachable", 3
			return s
		}())},
		wantMessage: "the host reports a problem (status.operationalStatus is not OK; see status.errorType and status.errorMessage): operationalStatus error, power management error: BMC unreachable"},
	{name: "an available host whose BMC changed since the operator looked is not registered", stage: "HostsRegistered", kind: "BareMetalHost", obj: "mgmt-cp-0",
		steps: []providerStep{statusStep(hostStatus("available", "OK", 1)),
			specStep(`{"spec":{"bmc":{"address":"redfish-virtualmedia://192.0.2.99/redfish/v1/Systems/1"}}}`)},
		wantMessage: "current spec"},

	{name: "a Cluster that Cluster API has not seen is not ready", stage: "InfrastructureReady", kind: "Cluster", obj: "mgmt",
		wantMessage: "current spec"},
	{name: "a Cluster provisioned for an older spec is not ready", stage: "InfrastructureReady", kind: "Cluster", obj: "mgmt",
		steps:       []providerStep{statusStep(clusterStatus(1, 1)), specStep(`{"spec":{"clusterNetwork":{"serviceDomain":"mgmt.example"}}}`)},
		wantMessage: "current spec"},
	{name: "a Cluster waiting for its Metal3Cluster is not ready", stage: "InfrastructureReady", kind: "Cluster", obj: "mgmt",
		steps: []providerStep{statusStep(clusterStatus(0, 1))}, wantMessage: "infrastructureProvisioned"},
	{name: "a Cluster with its infrastructure provisioned is ready", stage: "InfrastructureReady", kind: "Cluster", obj: "mgmt",
		steps: []providerStep{statusStep(clusterStatus(1, 1))}, wantReady: true},
	{name: "a Cluster written in v1beta1 is not judged, and the message says which version to write", stage: "InfrastructureReady",
		object: func(ns string) *unstructured.Unstructured {
			c := object("cluster.x-k8s.io/v1beta1", "Cluster", ns, "old")
			c.Object["spec"] = map[string]any{"infrastructureRef": map[string]any{
				"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Cluster", "name": "old"}}
			return c
		},
		steps:       []providerStep{statusStep(map[string]any{"infrastructureReady": true, "observedGeneration": 1, "phase": "Provisioned"})},
		wantMessage: "cluster.x-k8s.io/v1beta2"},
	{name: "a Metal3Cluster whose Ready condition is for an older spec is not ready", stage: "InfrastructureReady", kind: "Metal3Cluster", obj: "mgmt",
		steps:       []providerStep{statusStep(metal3ClusterStatus(true, 1)), specStep(`{"spec":{"controlPlaneEndpoint":{"port":6444}}}`)},
		wantMessage: "metadata.generation"},
	{name: "a provisioned Metal3Cluster is ready", stage: "InfrastructureReady", kind: "Metal3Cluster", obj: "mgmt",
		steps: []providerStep{statusStep(metal3ClusterStatus(true, 1))}, wantReady: true},

	{name: "a control plane creating its first machine is not initialized", stage: "ControlPlaneInitialized", kind: "KubeadmControlPlane", obj: "mgmt",
		steps:       []providerStep{statusStep(kcpStatus(replicaStatus(1, 1, 1, 0, map[string]int64{"v1.35.4": 1}, false), false))},
		wantMessage: "first control-plane machine"},
	{name: "a control plane that cannot reach its first machine's API server yet (no status.observedGeneration) says what the machine waits for", stage: "ControlPlaneInitialized", kind: "KubeadmControlPlane", obj: "mgmt",
		// As KCP writes it while every reconcile fails on the workload
		// cluster's connection: conditions, no observedGeneration.
		steps: []providerStep{statusStep(map[string]any{
			"initialization": map[string]any{"controlPlaneInitialized": false},
			"replicas":       1,
			"conditions": conditions(condition("Initialized", false, 1), func() map[string]any {
				c := condition("MachinesReady", false, 1)
				c["message"] = "* Machine mgmt-n94hj:\n  * InfrastructureReady:\n    * AssociateBareMetalHost: Waiting for bootstrap data to be ready before proceeding"
				return c
			}()),
		})},
		wantMessage: "waiting for the first control-plane machine to serve the API (status.initialization.controlPlaneInitialized, condition Initialized at metadata.generation): " +
			"* Machine mgmt-n94hj:   * InfrastructureReady:     * AssociateBareMetalHost: Waiting for bootstrap data to be ready before proceeding"},
	{name: "a control plane initialized for an older spec is not initialized until KCP has seen the current one", stage: "ControlPlaneInitialized", kind: "KubeadmControlPlane", obj: "mgmt",
		steps: []providerStep{statusStep(kcpStatus(replicaStatus(1, 1, 1, 1, map[string]int64{"v1.35.4": 1}, false), true)),
			specStep(`{"spec":{"version":"v1.35.5"}}`)},
		wantMessage: "condition Initialized at metadata.generation"},
	{name: "a control plane whose first machine serves the API is initialized", stage: "ControlPlaneInitialized", kind: "KubeadmControlPlane", obj: "mgmt",
		steps:     []providerStep{statusStep(kcpStatus(replicaStatus(1, 1, 1, 1, map[string]int64{"v1.35.4": 1}, false), true))},
		wantReady: true},
	{name: "a machine template has no status and is ready as created", stage: "ControlPlaneInitialized", kind: "Metal3MachineTemplate", obj: "mgmt-controlplane",
		wantReady: true},
	{name: "an initialized control plane with one of three machines is not ready", stage: "ControlPlaneReady", kind: "KubeadmControlPlane", obj: "mgmt",
		steps:       []providerStep{statusStep(kcpStatus(replicaStatus(1, 1, 1, 1, map[string]int64{"v1.35.4": 1}, true), true))},
		wantMessage: "spec.replicas control-plane machines"},
	{name: "three machines whose nodes are not all matched yet are not ready", stage: "ControlPlaneReady", kind: "KubeadmControlPlane", obj: "mgmt",
		steps:       []providerStep{statusStep(kcpStatus(replicaStatus(1, 3, 3, 2, map[string]int64{"v1.35.4": 3}, true), true))},
		wantMessage: "matched by providerID"},
	{name: "three ready and Available control-plane machines are ready", stage: "ControlPlaneReady", kind: "KubeadmControlPlane", obj: "mgmt",
		steps:     []providerStep{statusStep(kcpStatus(replicaStatus(1, 3, 3, 3, map[string]int64{"v1.35.4": 3}, true), true))},
		wantReady: true},
	{name: "a control plane not yet seen after a version bump is not ready", stage: "ControlPlaneReady", kind: "KubeadmControlPlane", obj: "mgmt",
		steps: []providerStep{statusStep(kcpStatus(replicaStatus(1, 3, 3, 3, map[string]int64{"v1.35.4": 3}, true), true)),
			specStep(`{"spec":{"version":"v1.35.5"}}`)},
		wantMessage: "current spec"},
	{name: "a control plane rolling out a new version is not ready", stage: "ControlPlaneReady", kind: "KubeadmControlPlane", obj: "mgmt",
		steps: []providerStep{specStep(`{"spec":{"version":"v1.35.5"}}`),
			statusStep(kcpStatus(replicaStatus(2, 4, 1, 4, map[string]int64{"v1.35.4": 3, "v1.35.5": 1}, true), true))},
		wantMessage: "up to date"},

	{name: "workers at an older spec are not ready", stage: "WorkersReady", kind: "MachineDeployment", obj: "mgmt-workers",
		steps:       []providerStep{statusStep(replicaStatus(1, 2, 2, 2, map[string]int64{"v1.35.4": 2}, true)), specStep(`{"spec":{"replicas":3}}`)},
		wantMessage: "current spec"},
	{name: "workers still provisioning are not ready", stage: "WorkersReady", kind: "MachineDeployment", obj: "mgmt-workers",
		steps:       []providerStep{statusStep(replicaStatus(1, 2, 2, 0, map[string]int64{"v1.35.4": 2}, false))},
		wantMessage: "every worker machine"},
	{name: "two ready and Available workers are ready", stage: "WorkersReady", kind: "MachineDeployment", obj: "mgmt-workers",
		steps: []providerStep{statusStep(replicaStatus(1, 2, 2, 2, map[string]int64{"v1.35.4": 2}, true))}, wantReady: true},

	{name: "a Cluster whose API server Cluster API cannot reach is not ready", stage: "ClusterReady", kind: "Cluster", obj: "mgmt",
		steps: []providerStep{statusStep(clusterStatus(2, 1))}, wantMessage: "RemoteConnectionProbe"},
	{name: "an Available Cluster is ready", stage: "ClusterReady", kind: "Cluster", obj: "mgmt",
		steps: []providerStep{statusStep(clusterStatus(3, 1))}, wantReady: true},
}

// TestCAPM3ChecksOnLiveObjects creates each object through the real CRDs,
// writes what the controllers (or a user) write, reads it back and asks
// the profile's stage whether it is ready.
func TestCAPM3ChecksOnLiveObjects(t *testing.T) {
	ns := providerNamespace(t)
	c, _ := newClient(t)
	p := mustProfile(t, "capm3")
	for i, tc := range verdictCases {
		t.Run(tc.name, func(t *testing.T) {
			var obj *unstructured.Unstructured
			if tc.object != nil {
				obj = tc.object(ns)
			} else {
				obj = fixtureObject(t, ns, tc.kind, tc.obj)
			}
			obj.SetName(fmt.Sprintf("%s-%02d", obj.GetName(), i))
			if err := c.Create(testContext(t), obj.DeepCopy()); err != nil {
				t.Fatalf("create %s: %v", stages.ObjectRef(obj), err)
			}
			live := play(t, c, obj, tc.steps...)
			checker, err := stages.NewChecker(stageSpec(t, p, tc.stage).ReadyWhen)
			if err != nil {
				t.Fatal(err)
			}
			v := checker.Evaluate(live)
			if v.Ready != tc.wantReady {
				t.Fatalf("%s ready = %v (%s), want %v\nstatus: %v", tc.stage, v.Ready, v.Message, tc.wantReady, live.Object["status"])
			}
			if !tc.wantReady && !strings.Contains(v.Message, tc.wantMessage) {
				t.Errorf("message %q does not say %q", v.Message, tc.wantMessage)
			}
		})
	}
}

// TestCAPM3StagesInOrder walks the capm3 plan over the fixture on the real
// CRDs with the executor: each stage applies its objects and stays
// InProgress until the providers write what seed 002 says they write at
// that step, then becomes Ready.
func TestCAPM3StagesInOrder(t *testing.T) {
	ns := providerNamespace(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	plan, err := stages.BuildPlan(mustProfile(t, "capm3").Stages, loadObjects(t, capm3Fixture, ns))
	if err != nil {
		t.Fatal(err)
	}
	kcp3 := kcpStatus(replicaStatus(1, 3, 3, 3, map[string]int64{"v1.35.4": 3}, true), true)
	// providers plays the controllers once a stage's objects are applied.
	providers := map[string]func(obj *unstructured.Unstructured) map[string]any{
		"HostsRegistered/BareMetalHost":     func(*unstructured.Unstructured) map[string]any { return hostStatus("available", "OK", 1) },
		"InfrastructureReady/Metal3Cluster": func(*unstructured.Unstructured) map[string]any { return metal3ClusterStatus(true, 1) },
		"InfrastructureReady/Cluster":       func(*unstructured.Unstructured) map[string]any { return clusterStatus(1, 1) },
		"ControlPlaneInitialized/KubeadmControlPlane": func(*unstructured.Unstructured) map[string]any {
			return kcpStatus(replicaStatus(1, 1, 1, 1, map[string]int64{"v1.35.4": 1}, false), true)
		},
		"ControlPlaneReady/KubeadmControlPlane": func(*unstructured.Unstructured) map[string]any { return kcp3 },
		"WorkersReady/MachineDeployment": func(*unstructured.Unstructured) map[string]any {
			return replicaStatus(1, 2, 2, 2, map[string]int64{"v1.35.4": 2}, true)
		},
		"ClusterReady/Cluster": func(*unstructured.Unstructured) map[string]any { return clusterStatus(3, 1) },
	}
	var walked []string
	for i := range plan.Stages {
		stage := &plan.Stages[i]
		ctx := testContext(t)
		if res := e.ApplyStage(ctx, stage, owner); res.State == capstanv1.StageFailed {
			t.Fatalf("apply %s: %v", stage.Name, res.Err)
		}
		if stage.Action == capstanv1.StageActionValidate {
			// Preflight acts in ApplyStage (above) and waits on nothing.
			if res := e.WaitStage(ctx, stage, owner); res.State != capstanv1.StageReady {
				t.Fatalf("%s = %s (%q), want %s", stage.Name, res.State, res.Message, capstanv1.StageReady)
			}
			walked = append(walked, stage.Name)
			continue
		}
		// Before the providers act, the stage is waiting, and says on what.
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		res := e.WaitStage(short, stage, owner)
		cancel()
		if res.State != capstanv1.StageInProgress || !strings.HasPrefix(res.Message, "waiting for ") {
			t.Fatalf("%s before the providers act = %s (%q, err %v), want %s", stage.Name, res.State, res.Message, res.Err, capstanv1.StageInProgress)
		}
		for _, obj := range stage.Objects {
			if write := providers[stage.Name+"/"+obj.GetKind()]; write != nil {
				play(t, c, obj, statusStep(write(obj)))
			}
		}
		if res := e.WaitStage(ctx, stage, owner); res.State != capstanv1.StageReady {
			t.Fatalf("%s after the providers acted = %s (%q, err %v), want %s", stage.Name, res.State, res.Message, res.Err, capstanv1.StageReady)
		}
		walked = append(walked, stage.Name)
	}
	if got := strings.Join(walked, " "); got != "Preflight HostsRegistered InfrastructureReady ControlPlaneInitialized ControlPlaneReady WorkersReady ClusterReady" {
		t.Errorf("walked %s", got)
	}

	// The bootstrap profile's NodesReady judges the same finished cluster
	// with its own, condensed checks: every object is ready.
	nodesReady, err := stages.NewChecker(stageSpec(t, mustProfile(t, "bootstrap"), "NodesReady").ReadyWhen)
	if err != nil {
		t.Fatal(err)
	}
	for _, stage := range plan.Stages {
		if stage.Action != capstanv1.StageActionApply {
			continue
		}
		for _, obj := range stage.Objects {
			if v := nodesReady.Evaluate(play(t, c, obj)); !v.Ready {
				t.Errorf("bootstrap NodesReady: %s not ready: %s", stages.ObjectRef(obj), v.Message)
			}
		}
	}
}

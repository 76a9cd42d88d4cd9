package sim

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/stages"
)

var (
	controlPlaneHosts = []string{"node-0", "node-1", "node-2"}
	workerHosts       = []string{"node-3", "node-4"}
)

// testClusterReadyInSeedOrder builds the fixture's cluster with no fault
// and checks that every capm3 stage is ready in the end, that the control
// plane's hosts were provisioned one at a time, the workers' only after
// the control plane was initialized, and that each Machine carries the
// providerID of its host.
func testClusterReadyInSeedOrder(t *testing.T, env *testenv.Env) {
	f := newSimFixture(t, env, nil)
	_, events := f.startSimulator(TestOptions(""))
	f.waitReady(withDeadline(t, 2*time.Minute))
	h := f.rec.history()

	assertControlPlaneOneAtATime(t, h)
	initialized := firstRV(h, kindKubeadmControlPlane.Kind, func(o *unstructured.Unstructured) bool {
		return flag(o.Object, "status", "initialization", "controlPlaneInitialized")
	})
	if initialized == 0 {
		t.Fatal("no change recorded the KubeadmControlPlane initialized")
	}
	for _, host := range workerHosts {
		provisioning := firstRV(h, kindBareMetalHost.Kind, func(o *unstructured.Unstructured) bool {
			return o.GetName() == host && str(o.Object, "status", "provisioning", "state") == hostProvisioning
		})
		if provisioning == 0 || provisioning < initialized {
			t.Errorf("worker host %s started provisioning at revision %d, before the control plane was initialized at %d", host, provisioning, initialized)
		}
	}
	for _, host := range append(slices.Clone(controlPlaneHosts), workerHosts...) {
		if got := hostStates(h, host); !slices.Equal(got, []string{"registering", "inspecting", "preparing", "available", "provisioning", "provisioned"}) {
			t.Errorf("host %s went through %v", host, got)
		}
	}
	assertProviderIDs(t, f, 5)
	assertPoolAllocations(t, f, 5)
	assertNoKubeconfig(t, f, "demo")

	want := "BareMetalHost " + f.ns + "/node-0: preparing -> available"
	if !strings.Contains(events.String(), want) {
		t.Errorf("events lack %q", want)
	}
}

// assertControlPlaneOneAtATime checks that no control-plane host started
// provisioning while another was still provisioning.
func assertControlPlaneOneAtATime(t *testing.T, h []recordedChange) {
	t.Helper()
	inFlight := map[string]bool{}
	last := map[string]string{}
	for _, c := range h {
		if c.kind != kindBareMetalHost.Kind || !slices.Contains(controlPlaneHosts, c.name) {
			continue
		}
		state := str(c.obj.Object, "status", "provisioning", "state")
		if state == last[c.name] {
			continue
		}
		last[c.name] = state
		switch state {
		case hostProvisioning:
			for other := range inFlight {
				if other != c.name {
					t.Errorf("control-plane host %s started provisioning while %s was provisioning", c.name, other)
				}
			}
			inFlight[c.name] = true
		case hostProvisioned, hostAvailable:
			delete(inFlight, c.name)
		}
	}
}

// assertProviderIDs checks every Machine: Running, with the node matched,
// and providerID metal3://<uid of the host its Metal3Machine consumes>.
func assertProviderIDs(t *testing.T, f *simFixture, want int) {
	t.Helper()
	machines := f.list(kindMachine)
	if len(machines) != want {
		t.Errorf("%d machines, want %d", len(machines), want)
	}
	hosts := map[string]unstructured.Unstructured{}
	for _, h := range f.list(kindBareMetalHost) {
		if ref := object(h.Object, "spec", "consumerRef"); ref != nil {
			hosts[str(ref, "name")] = h
		}
	}
	for _, m := range machines {
		m3m := str(m.Object, "spec", "infrastructureRef", "name")
		host, ok := hosts[m3m]
		if !ok {
			t.Errorf("Machine %s: no host consumed by Metal3Machine %s", m.GetName(), m3m)
			continue
		}
		wantID := "metal3://" + string(host.GetUID())
		if got := str(m.Object, "spec", "providerID"); got != wantID {
			t.Errorf("Machine %s on host %s: providerID %q, want %q", m.GetName(), host.GetName(), got, wantID)
		}
		if str(m.Object, "status", "phase") != "Running" || str(m.Object, "status", "nodeRef", "name") == "" {
			t.Errorf("Machine %s: phase %q, nodeRef %v", m.GetName(), str(m.Object, "status", "phase"), object(m.Object, "status", "nodeRef"))
		}
		if str(host.Object, "status", "provisioning", "state") != hostProvisioned || str(host.Object, "spec", "image", "url") == "" {
			t.Errorf("host %s of Machine %s: state %q, image %v", host.GetName(), m.GetName(),
				str(host.Object, "status", "provisioning", "state"), object(host.Object, "spec", "image"))
		}
	}
}

// firstRV is the revision of the first recorded change of kind for which
// match holds, 0 if none.
func firstRV(h []recordedChange, kind string, match func(*unstructured.Unstructured) bool) int64 {
	for _, c := range h {
		if c.kind == kind && !c.deleted && match(c.obj) {
			return c.rv
		}
	}
	return 0
}

// testStuckHost holds a worker's host in provisioning: the other worker
// finishes, this one does not, and the workers' stage waits; once the
// fault is cleared, the host is provisioned and every stage is ready.
func testStuckHost(t *testing.T, env *testenv.Env) {
	f := newSimFixture(t, env, nil)
	opts := TestOptions("")
	opts.Faults = map[string]Fault{"node-4": FaultStuckProvisioning}
	s, _ := f.startSimulator(opts)
	ctx := withDeadline(t, 2*time.Minute)
	f.waitFor(ctx, kindMachineDeployment, "demo-workers", "one worker ready", func(o *unstructured.Unstructured) bool {
		n, _ := integer(o.Object, "status", "readyReplicas")
		return n == 1
	})
	if got := str(f.get(kindBareMetalHost, "node-4").Object, "status", "provisioning", "state"); got != hostProvisioning {
		t.Fatalf("stuck host node-4 is %q, want %q", got, hostProvisioning)
	}
	if got := str(f.get(kindBareMetalHost, "node-3").Object, "status", "provisioning", "state"); got != hostProvisioned {
		t.Fatalf("host node-3 is %q, want %q", got, hostProvisioned)
	}
	workers := stageChecker(t, "WorkersReady")
	if v := workers.Evaluate(f.get(kindMachineDeployment, "demo-workers")); v.Ready {
		t.Fatal("WorkersReady is ready with a worker's host stuck in provisioning")
	}

	s.ClearFault("node-4")
	f.waitReady(ctx)
	if got := hostStates(f.rec.history(), "node-4"); got[len(got)-1] != hostProvisioned || slices.Contains(got[:len(got)-1], hostProvisioned) {
		t.Errorf("node-4 went through %v; want provisioned only after the fault was cleared", got)
	}
}

func stageChecker(t *testing.T, stage string) *stages.Checker {
	t.Helper()
	p, err := stages.LoadProfile("capm3")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Stages {
		if s.Name == stage {
			c, err := stages.NewChecker(s.ReadyWhen)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	t.Fatalf("capm3 has no stage %s", stage)
	return nil
}

// testProvisioningFailsOnce makes the second control-plane host fail its
// first provisioning: the BareMetal Operator reports the error,
// deprovisions the host, provisions it again, and the cluster becomes
// ready with the control plane still built one machine at a time.
func testProvisioningFailsOnce(t *testing.T, env *testenv.Env) {
	f := newSimFixture(t, env, nil)
	opts := TestOptions("")
	opts.Faults = map[string]Fault{"node-1": FaultProvisionFailsOnce}
	f.startSimulator(opts)
	f.waitReady(withDeadline(t, 2*time.Minute))
	h := f.rec.history()
	want := []string{"registering", "inspecting", "preparing", "available", "provisioning", "provisioning(error)",
		"deprovisioning(error)", "available", "provisioning", "provisioned"}
	if got := hostStates(h, "node-1"); !slices.Equal(got, want) {
		t.Errorf("node-1 went through\n %v\nwant\n %v", got, want)
	}
	errorType := firstRV(h, kindBareMetalHost.Kind, func(o *unstructured.Unstructured) bool {
		return o.GetName() == "node-1" && str(o.Object, "status", "errorType") == "provisioning error"
	})
	if errorType == 0 {
		t.Error("node-1 never reported errorType \"provisioning error\"")
	}
	assertControlPlaneOneAtATime(t, h)
	assertProviderIDs(t, f, 5)
}

// testUpgrade bumps the Kubernetes version of the control plane and the
// workers, with maxSurge 0 (no spare host): every machine is replaced by
// one at the new version, the control plane never has fewer than two or
// more than three machines, and every stage is ready again at the new
// generation.
func testUpgrade(t *testing.T, env *testenv.Env) {
	f := newSimFixture(t, env, func(kind, _ string, o *unstructured.Unstructured) {
		switch kind {
		case "KubeadmControlPlane":
			set(o.Object, map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxSurge": int64(0)}}, "spec", "rollout", "strategy")
		case "MachineDeployment":
			set(o.Object, map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxSurge": int64(0), "maxUnavailable": int64(1)}}, "spec", "rollout", "strategy")
		}
	})
	f.startSimulator(TestOptions(""))
	ctx := withDeadline(t, 3*time.Minute)
	f.waitReady(ctx)
	before := map[string]bool{}
	for _, m := range f.list(kindMachine) {
		before[m.GetName()] = true
	}
	h := f.rec.history()
	upgradeStart := h[len(h)-1].rv

	f.patch(kindKubeadmControlPlane, "demo", `{"spec":{"version":"v1.35.5"}}`)
	f.patch(kindMachineDeployment, "demo-workers", `{"spec":{"template":{"spec":{"version":"v1.35.5"}}}}`)
	f.waitReady(ctx)

	for _, m := range f.list(kindMachine) {
		if before[m.GetName()] || str(m.Object, "spec", "version") != "v1.35.5" {
			t.Errorf("Machine %s at %s was not replaced", m.GetName(), str(m.Object, "spec", "version"))
		}
	}
	assertProviderIDs(t, f, 5)
	cp := map[string]bool{}
	for _, c := range f.rec.history() {
		if c.kind != kindMachine.Kind {
			continue
		}
		if _, ok := c.obj.GetLabels()[controlPlaneLabel]; !ok {
			continue
		}
		if c.deleted {
			delete(cp, c.name)
		} else {
			cp[c.name] = true
		}
		if c.rv > upgradeStart && (len(cp) < 2 || len(cp) > 3) {
			t.Errorf("at revision %d the control plane had %d machines, want 2 or 3 (maxSurge 0)", c.rv, len(cp))
		}
	}
}

// testScaleDown removes a worker: its Machine goes, its host is released
// and deprovisioned back to available, and the workers' stage is ready
// again with one replica.
func testScaleDown(t *testing.T, env *testenv.Env) {
	f := newSimFixture(t, env, nil)
	f.startSimulator(TestOptions(""))
	ctx := withDeadline(t, 2*time.Minute)
	f.waitReady(ctx)
	f.patch(kindMachineDeployment, "demo-workers", `{"spec":{"replicas":1}}`)
	f.waitReady(ctx)
	var released []string
	err := pollUntil(ctx, func() (bool, error) {
		released = released[:0]
		for _, host := range workerHosts {
			h := f.get(kindBareMetalHost, host)
			if str(h.Object, "status", "provisioning", "state") == hostAvailable && object(h.Object, "spec", "consumerRef") == nil {
				released = append(released, host)
			}
		}
		return len(released) == 1, nil
	})
	if err != nil {
		t.Fatalf("released worker hosts %v, want one: %v", released, err)
	}
	if got := hostStates(f.rec.history(), released[0]); !slices.Contains(got, hostDeprovisioning) {
		t.Errorf("released host %s went through %v, without deprovisioning", released[0], got)
	}
	assertProviderIDs(t, f, 4)
	assertPoolAllocations(t, f, 4)
}

// assertPoolAllocations checks that the IP pool holds one address per
// machine, each rendered into its machine's meta data.
func assertPoolAllocations(t *testing.T, f *simFixture, want int) {
	t.Helper()
	indexes := object(f.get(kindIPPool, "demo-provisioning").Object, "status", "indexes")
	if len(indexes) != want {
		t.Errorf("IPPool demo-provisioning allocates %v, want %d addresses", indexes, want)
	}
	for _, a := range f.list(kindIPAddress) {
		if claim := str(a.Object, "spec", "claim", "name"); indexes[claim] != str(a.Object, "spec", "address") {
			t.Errorf("IPAddress %s of claim %s is not in the pool's status", a.GetName(), claim)
		}
	}
	for _, d := range f.list(kindMetal3Data) {
		secret := &corev1.Secret{}
		if err := f.c.Get(t.Context(), types.NamespacedName{Namespace: f.ns, Name: str(d.Object, "spec", "metaData", "name")}, secret); err != nil {
			t.Errorf("meta data of Metal3Data %s: %v", d.GetName(), err)
			continue
		}
		var meta map[string]any
		if err := yaml.Unmarshal(secret.Data["metaData"], &meta); err != nil {
			t.Fatal(err)
		}
		if want := indexes[d.GetName()+"-demo-provisioning"]; want == nil || meta["provisioningIP"] != want {
			t.Errorf("meta data of Metal3Data %s has provisioningIP %v, want %v", d.GetName(), meta["provisioningIP"], want)
		}
	}
}

// testExecutorWalk lets Capstan's executor walk the capm3 plan over the
// fixture while the simulator plays the providers: each stage is applied
// only once the one before is ready, and each becomes ready. A second walk
// applies every object again and finds every stage ready at once, with the
// fields CAPM3 set on the hosts still there.
func testExecutorWalk(t *testing.T, env *testenv.Env) {
	c, err := client.NewWithWatch(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(t.Context(), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	f := &simFixture{t: t, env: env, c: c, ns: ns, objs: loadFixture(t, "testdata/cluster.yaml", ns)}
	f.rec = recordChanges(t, c, ns, kindBareMetalHost, kindMachine, kindKubeadmControlPlane)
	profile, err := stages.LoadProfile("capm3")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := stages.BuildPlan(profile.Stages, f.objs)
	if err != nil {
		t.Fatal(err)
	}
	f.startSimulator(TestOptions(""))
	e := stages.NewExecutor(c)
	owner := stages.Owner{Name: "demo", Namespace: ns}
	ctx := withDeadline(t, 3*time.Minute)
	for walk := 1; walk <= 2; walk++ {
		for i := range plan.Stages {
			st := &plan.Stages[i]
			if res := e.Run(ctx, st, owner, stages.RunOptions{}); res.State != capstanv1.StageReady {
				t.Fatalf("walk %d: stage %s is %s: %s (%v)", walk, st.Name, res.State, res.Message, res.Err)
			}
		}
	}
	for _, h := range f.list(kindBareMetalHost) {
		if object(h.Object, "spec", "consumerRef") == nil || str(h.Object, "spec", "image", "url") == "" {
			t.Errorf("host %s lost CAPM3's fields to the second walk: %v", h.GetName(), h.Object["spec"])
		}
	}
	assertProviderIDs(t, f, 5)
}

// testClusterDeletion deletes the cluster's objects as a prune would,
// without a garbage collector: every machine the simulator created goes,
// and every host is deprovisioned back to available, free for the next
// cluster.
func testClusterDeletion(t *testing.T, env *testenv.Env) {
	f := newSimFixture(t, env, nil)
	f.startSimulator(TestOptions(""))
	ctx := withDeadline(t, 2*time.Minute)
	f.waitReady(ctx)
	for _, o := range f.objs {
		switch o.GetKind() {
		case "Cluster", "Metal3Cluster", "KubeadmControlPlane", "MachineDeployment":
			if err := f.c.Delete(ctx, o.DeepCopy()); err != nil {
				t.Fatalf("delete %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}
	err := pollUntil(ctx, func() (bool, error) {
		if len(f.list(kindMachine)) > 0 || len(f.list(kindMetal3Machine)) > 0 || len(f.list(kindMachineSet)) > 0 {
			return false, nil
		}
		for _, h := range f.list(kindBareMetalHost) {
			if str(h.Object, "status", "provisioning", "state") != hostAvailable || object(h.Object, "spec", "consumerRef") != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("cluster objects left behind: %d Machines, %d Metal3Machines, %d MachineSets: %v",
			len(f.list(kindMachine)), len(f.list(kindMetal3Machine)), len(f.list(kindMachineSet)), err)
	}
	for _, k := range []schema.GroupVersionKind{kindKubeadmConfig, kindMetal3DataClaim, kindMetal3Data, kindIPClaim, kindIPAddress} {
		if n := len(f.list(k)); n > 0 {
			t.Errorf("%d %s left behind", n, k.Kind)
		}
	}
}

package metal3

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/promserver/promtest"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/stages"
)

// Timeouts of the real walk. The machine running the suite may be small
// and busy: each bounds a wait that normally takes seconds.
const (
	// stageTimeout bounds one stage on the real providers.
	stageTimeout = 5 * time.Minute
	// walkTimeout bounds the whole walk from a created deployment to
	// ClusterReady.
	walkTimeout = 15 * time.Minute
)

var (
	hostGVK    = schema.GroupVersionKind{Group: "metal3.io", Version: "v1alpha1", Kind: "BareMetalHost"}
	clusterGVK = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Cluster"}
	kcpGVK     = schema.GroupVersionKind{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta2", Kind: "KubeadmControlPlane"}
	machineGVK = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Machine"}
)

// mgmtExample commits the mgmt example (its overlay and the Metal3 base) to
// a new repository, moved into namespace ns, and returns its
// ClusterDeployment reading that repository, with vars added to its
// substitutions, and the files committed.
func mgmtExample(t *testing.T, ns string, vars map[string]string) (*capstanv1.ClusterDeployment, map[string]string) {
	t.Helper()
	files := exampleFiles(t, ns)
	cd := exampleDeployment(t, ns, vars)
	cd.Spec.Source = commit(t, ns, files, "the mgmt example")
	return cd, files
}

// exampleFiles reads the mgmt example's files (its overlay, its upgrade
// and the Metal3 base) for a commit, with the overlay's namespace, which
// its namespace.yaml creates, moved to target.
func exampleFiles(t *testing.T, target string) map[string]string {
	t.Helper()
	files := map[string]string{}
	for _, dir := range []string{"bases/metal3-cluster", "clusters/mgmt/overlay", "clusters/mgmt/upgrade"} {
		entries, err := os.ReadDir(filepath.Join("..", "..", "examples", dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			content, err := os.ReadFile(filepath.Join("..", "..", "examples", dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			files[dir+"/"+e.Name()] = string(content)
		}
	}
	files["clusters/mgmt/overlay/kustomization.yaml"] = strings.Replace(files["clusters/mgmt/overlay/kustomization.yaml"], "namespace: mgmt", "namespace: "+target, 1)
	files["clusters/mgmt/upgrade/kustomization.yaml"] = strings.Replace(files["clusters/mgmt/upgrade/kustomization.yaml"], "namespace: mgmt", "namespace: "+target, 1)
	files["clusters/mgmt/overlay/namespace.yaml"] = strings.Replace(files["clusters/mgmt/overlay/namespace.yaml"], "name: mgmt", "name: "+target, 1)
	return files
}

// exampleDeployment is the mgmt example's ClusterDeployment, in ns, with
// vars added to its substitutions and no source yet.
func exampleDeployment(t *testing.T, ns string, vars map[string]string) *capstanv1.ClusterDeployment {
	t.Helper()
	cd := &capstanv1.ClusterDeployment{}
	raw, err := os.ReadFile("../../examples/clusters/mgmt/clusterdeployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(raw, cd); err != nil {
		t.Fatalf("examples/clusters/mgmt/clusterdeployment.yaml: %v", err)
	}
	cd.Namespace = ns
	createDemoKeySecret(t, ns) // its BMC credentials are encrypted for the demo key
	maps.Copy(cd.Spec.Substitute, vars)
	return cd
}

// commit commits files to a new repository named after ns and returns the
// source of a deployment in ns that reads it.
func commit(t *testing.T, ns string, files map[string]string, message string) *capstanv1.SourceSpec {
	t.Helper()
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, message); err != nil {
		t.Fatal(err)
	}
	return &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
		URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(t, newClient(t), ns)},
	}}
}

// firstSeen records, from a watch opened before anything is applied, the
// resource version at which each object of one kind first satisfied a
// condition. Resource versions come from etcd's single revision counter,
// so they order events across kinds: an object that met its condition at
// a lower version did so before a deployment status written at a higher
// one.
type firstSeen struct {
	mu   sync.Mutex
	at   map[string]int64    // name -> resource version
	seen map[string][]string // name -> what describe said, each change once
}

// watchFirst follows the objects of one kind in ns; cond may be nil, to
// keep only what describe says of them.
func watchFirst(t *testing.T, gvk schema.GroupVersionKind, ns string, cond func(*unstructured.Unstructured) bool, describe func(*unstructured.Unstructured) string) *firstSeen {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	w, err := c.Watch(ctx, list, client.InNamespace(ns))
	if err != nil {
		t.Fatalf("watch %s: %v", gvk.Kind, err)
	}
	f := &firstSeen{at: map[string]int64{}, seen: map[string][]string{}}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			obj, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || ev.Type == watch.Error || ev.Type == watch.Deleted {
				continue
			}
			f.mu.Lock()
			if s := describe(obj); len(f.seen[obj.GetName()]) == 0 || f.seen[obj.GetName()][len(f.seen[obj.GetName()])-1] != s {
				f.seen[obj.GetName()] = append(f.seen[obj.GetName()], s)
			}
			if _, done := f.at[obj.GetName()]; !done && cond != nil && cond(obj) {
				f.at[obj.GetName()] = resourceVersion(obj)
			}
			f.mu.Unlock()
		}
	}()
	return f
}

// get returns the resource version at which name met the condition.
func (f *firstSeen) get(name string) (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rv, ok := f.at[name]
	return rv, ok
}

// history says what each object went through, one line per object.
func (f *firstSeen) history() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := slices.Sorted(maps.Keys(f.seen))
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "\n  %s:\n      %s", n, strings.Join(f.seen[n], "\n   -> "))
	}
	return b.String()
}

func resourceVersion(obj client.Object) int64 {
	rv, _ := strconv.ParseInt(obj.GetResourceVersion(), 10, 64)
	return rv
}

// hostState is a BareMetalHost's state as BMO reports it.
func hostState(obj *unstructured.Unstructured) string {
	state, _, _ := unstructured.NestedString(obj.Object, "status", "provisioning", "state")
	op, _, _ := unstructured.NestedString(obj.Object, "status", "operationalStatus")
	errType, _, _ := unstructured.NestedString(obj.Object, "status", "errorType")
	s := state + "/" + op
	if errType != "" {
		s += "(" + errType + ")"
	}
	return s
}

func infrastructureProvisioned(obj *unstructured.Unstructured) bool {
	ok, _, _ := unstructured.NestedBool(obj.Object, "status", "initialization", "infrastructureProvisioned")
	return ok
}

// clusterState is what Cluster API reports of a Cluster's provisioning.
func clusterState(obj *unstructured.Unstructured) string {
	phase, _, _ := unstructured.NestedString(obj.Object, "status", "phase")
	cp, _, _ := unstructured.NestedBool(obj.Object, "status", "initialization", "controlPlaneInitialized")
	return fmt.Sprintf("%s infrastructureProvisioned=%t controlPlaneInitialized=%t", phase, infrastructureProvisioned(obj), cp)
}

// kcpState is what KCP reports of its first machine and its replicas.
func kcpState(obj *unstructured.Unstructured) string {
	og := "absent"
	if v, ok, _ := unstructured.NestedInt64(obj.Object, "status", "observedGeneration"); ok {
		og = strconv.FormatInt(v, 10)
	}
	init, _, _ := unstructured.NestedBool(obj.Object, "status", "initialization", "controlPlaneInitialized")
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	var cs []string
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Initialized" || m["type"] == "MachinesReady" || m["type"] == "Available" {
			cs = append(cs, fmt.Sprintf("%s=%s(%v %q)", m["type"], m["status"], m["reason"], m["message"]))
		}
	}
	r, _, _ := unstructured.NestedInt64(obj.Object, "status", "replicas")
	ready, _, _ := unstructured.NestedInt64(obj.Object, "status", "readyReplicas")
	return fmt.Sprintf("generation=%d observedGeneration=%s controlPlaneInitialized=%t replicas=%d ready=%d %s", obj.GetGeneration(), og, init, r, ready, strings.Join(cs, " "))
}

// mgmtHosts are the BareMetalHosts of the mgmt example.
var mgmtHosts = []string{"mgmt-cp-0", "mgmt-cp-1", "mgmt-cp-2", "mgmt-worker-0", "mgmt-worker-1"}

// The examples/ management cluster, on the real Cluster API, CAPM3, IPAM
// and BareMetal Operator with Cluster API's in-memory workload API server
// at its endpoint, and on the simulator: the daemon walks the capm3 stages to ClusterReady, each
// Ready in the profile's order and none started before the one ahead of
// it is Ready. HostsRegistered turns Ready only after BMO has made every
// host available, InfrastructureReady only after Cluster API has set the
// Cluster's infrastructureProvisioned, and while the first control-plane
// machine provisions, ControlPlaneInitialized says what it waits for.
func TestCapm3Example(t *testing.T) {
	onEachBackend(t, testCapm3Example)
}

func testCapm3Example(t *testing.T, b *backend) {
	c := newClient(t)
	ns := newNamespace(t, "capm3-example")
	b.play(t, ns)
	dumpStatus(t, ns, clusterGVK, kcpGVK, machineGVK)
	port := strconv.Itoa(freeLoopbackPort(t))
	cd, _ := mgmtExample(t, ns, map[string]string{
		"API_ENDPOINT": "127.0.0.1",
		"API_PORT":     port,
		// BMO's demo inspection names the NICs nic-1 and nic-2.
		"BOOT_INTERFACE": "nic-1",
	})
	sw := watchStages(t, ns, cd.Name)
	available := watchFirst(t, hostGVK, ns, func(h *unstructured.Unstructured) bool {
		state, _, _ := unstructured.NestedString(h.Object, "status", "provisioning", "state")
		return state == "available"
	}, hostState)
	provisioned := watchFirst(t, clusterGVK, ns, infrastructureProvisioned, clusterState)
	kcp := watchFirst(t, kcpGVK, ns, nil, kcpState)
	startDaemon(t, nil)
	t.Cleanup(func() {
		t.Logf("hosts:%s", available.history())
		t.Logf("cluster:%s", provisioned.history())
		t.Logf("control plane:%s", kcp.history())
		sw.mu.Lock()
		defer sw.mu.Unlock()
		for _, name := range slices.Sorted(maps.Keys(sw.messages)) {
			t.Logf("%s said while in progress:\n  %s", name, strings.Join(sw.messages[name], "\n  "))
		}
	})

	begin := time.Now()
	if err := c.Create(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	done := waitDeployment(t, c, ns, cd.Name, walkTimeout, "Ready", isReady)
	t.Logf("mgmt example on the %s providers at 127.0.0.1:%s: created -> Ready in %s (%s)",
		b.name, port, time.Since(begin).Round(time.Millisecond), stageDurations(done))

	profile, err := stages.LoadProfile("capm3")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, s := range profile.Stages {
		want = append(want, s.Name)
	}
	waitFor(t, stageTimeout, "the status watch to see every stage Ready", func() (bool, error) {
		sw.mu.Lock()
		defer sw.mu.Unlock()
		return len(sw.readyOrder) == len(want), fmt.Errorf("seen Ready: %v", sw.readyOrder)
	})
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if !slices.Equal(sw.readyOrder, want) {
		t.Errorf("stages became Ready in the order %v, want the profile's %v", sw.readyOrder, want)
	}
	for _, v := range sw.violations {
		t.Errorf("stage order broken: %s", v)
	}

	hostsReady := sw.readyAt["HostsRegistered"]
	for _, h := range mgmtHosts {
		if rv, ok := available.get(h); !ok {
			t.Errorf("HostsRegistered Ready at resource version %d, but BMO never reported BareMetalHost %s available", hostsReady, h)
		} else if rv >= hostsReady {
			t.Errorf("HostsRegistered Ready at resource version %d, before BMO reported BareMetalHost %s available (%d)", hostsReady, h, rv)
		}
	}
	infraReady := sw.readyAt["InfrastructureReady"]
	if rv, ok := provisioned.get("mgmt"); !ok {
		t.Errorf("InfrastructureReady Ready at resource version %d, but Cluster API never set Cluster mgmt's infrastructureProvisioned", infraReady)
	} else if rv >= infraReady {
		t.Errorf("InfrastructureReady Ready at resource version %d, before Cluster API set Cluster mgmt's infrastructureProvisioned (%d)", infraReady, rv)
	}

	// While KCP waits for its first machine, whose API server Cluster API
	// cannot reach yet, the stage says that, not a controller that has not
	// looked at the spec.
	kcpKey := "waiting for KubeadmControlPlane/" + ns + "/mgmt: "
	for _, msg := range sw.messages["ControlPlaneInitialized"] {
		if strings.HasPrefix(msg, kcpKey) && !strings.HasPrefix(msg, kcpKey+"waiting for the first control-plane machine to serve the API") {
			t.Errorf("ControlPlaneInitialized said %q, want it waiting for the first control-plane machine", msg)
		}
	}
}

func getDeployment(t testing.TB, c client.Client, ns, name string) *capstanv1.ClusterDeployment {
	t.Helper()
	cd := &capstanv1.ClusterDeployment{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, cd); err != nil {
		t.Fatal(err)
	}
	return cd
}

// overlay reads an overlay under testdata/ as files for a commit, with its
// namespace (kustomization.yaml's `namespace: NAME`, NAME being the
// overlay's folder) moved to ns.
func overlay(t *testing.T, name, ns string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range entries {
		content, err := os.ReadFile(filepath.Join("testdata", name, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[name+"/"+e.Name()] = string(content)
	}
	kustomization := name + "/kustomization.yaml"
	if !strings.Contains(files[kustomization], "namespace: "+name+"\n") {
		t.Fatalf("testdata/%s: namespace %s not found", kustomization, name)
	}
	files[kustomization] = strings.Replace(files[kustomization], "namespace: "+name+"\n", "namespace: "+ns+"\n", 1)
	return files
}

// A host BMO cannot register (BMO's demo provisioner fails any host named
// demo-registration-error) holds HostsRegistered InProgress, never Ready:
// the stage's message names the host and carries BMO's own error, the
// stage turns stuck once its stuckAfter passes, and the shipped
// CapstanStageStuck alert fires in a real Prometheus scraping the daemon.
func TestFailingHostIsNamedInStage(t *testing.T) {
	bins := promtest.Tools(t)
	providerLogs(t)
	c := newClient(t)
	ns := newNamespace(t, "failing-host")
	dumpStatus(t, ns, hostGVK)

	// The capm3 profile, with a stuckAfter short enough for a test. The
	// overlay holds a host only: the stages after HostsRegistered select
	// nothing, which preflight refuses unless they say they may be empty.
	specs, err := stages.StageSpecs(capstanv1.ClusterDeploymentSpec{Profile: "capm3"})
	if err != nil {
		t.Fatal(err)
	}
	after := false
	for i := range specs {
		specs[i].StuckAfter = nil
		specs[i].AllowEmpty = specs[i].AllowEmpty || after
		if specs[i].Name == "HostsRegistered" {
			specs[i].StuckAfter = &metav1.Duration{Duration: 2 * time.Second}
			after = true
		}
	}
	metricsAddr := promtest.FreeAddr(t)
	startDaemon(t, func(o *reconciler.Options) { o.MetricsAddr = metricsAddr })
	prom := promtest.Start(t, bins.Prometheus, shippedRules, metricsAddr, map[string]time.Duration{"CapstanStageStuck": 3 * time.Second})
	cd := &capstanv1.ClusterDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: "failing-host", Namespace: ns},
		Spec: capstanv1.ClusterDeploymentSpec{
			Source: commit(t, ns, overlay(t, "failing-host", ns), "a host BMO cannot register"),
			Path:   "failing-host",
			Stages: specs,
		},
	}
	if err := c.Create(context.Background(), cd); err != nil {
		t.Fatal(err)
	}

	host := "BareMetalHost/" + ns + "/demo-registration-error"
	stuck := waitDeployment(t, c, ns, cd.Name, stageTimeout, "HostsRegistered stuck on the host's registration error", func(cd *capstanv1.ClusterDeployment) bool {
		st := stage(cd, "HostsRegistered")
		return st.Stuck && strings.Contains(st.Message, "registration error")
	})
	st := stage(stuck, "HostsRegistered")
	t.Logf("HostsRegistered: %s stuck=%t attempts=%d: %s", st.State, st.Stuck, st.Attempts, st.Message)
	if st.State != capstanv1.StageInProgress {
		t.Errorf("HostsRegistered is %s, want InProgress", st.State)
	}
	// BMO's words, as the demo provisioner sets them.
	for _, want := range []string{"waiting for " + host + ": ", "state registering", "registration error: failed to register new host"} {
		if !strings.Contains(st.Message, want) {
			t.Errorf("HostsRegistered message %q does not say %q", st.Message, want)
		}
	}
	if isReady(stuck) || condition(stuck, capstanv1.ConditionStalled).Status == metav1.ConditionTrue {
		t.Errorf("a stuck stage must keep the deployment progressing, not Ready nor Stalled: %s", describe(stuck))
	}
	if next := stage(stuck, "InfrastructureReady"); next.State != capstanv1.StagePending {
		t.Errorf("InfrastructureReady is %s behind a stage that is not Ready", next.State)
	}

	labels := map[string]string{"alertname": "CapstanStageStuck", "namespace": ns, "cluster": cd.Name, "stage": "HostsRegistered"}
	waitFor(t, stageTimeout, "CapstanStageStuck to fire for HostsRegistered", func() (bool, error) {
		state, err := promtest.AlertState(t, prom, labels)
		if err != nil {
			return false, err
		}
		return state == "firing", fmt.Errorf("alert state %q", state)
	})
	deployment := fmt.Sprintf(`namespace=%q, cluster=%q`, ns, cd.Name)
	for expr, want := range map[string]string{
		"capstan_stage_stuck{" + deployment + `, stage="HostsRegistered"}`:                      "1",
		"capstan_stage_state{" + deployment + `, stage="HostsRegistered", state="InProgress"}`:  "1",
		"capstan_stage_state{" + deployment + `, stage="InfrastructureReady", state="Pending"}`: "1",
		// Waiting on a host is not a failed reconcile.
		"capstan_reconcile_consecutive_failures{" + deployment + "}": "0",
	} {
		if got, err := promtest.QueryValue(t, prom, expr); err != nil {
			t.Errorf("query: %v", err)
		} else if got != want {
			t.Errorf("%s = %s, want %s", expr, got, want)
		}
	}
	// Still not Ready: BMO keeps failing the host.
	if st := stage(getDeployment(t, c, ns, cd.Name), "HostsRegistered"); st.State == capstanv1.StageReady {
		t.Errorf("HostsRegistered turned Ready with a host BMO cannot register")
	}
}

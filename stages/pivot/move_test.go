package pivot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// fixture is a small Metal3 management cluster as the controllers leave
// it, written into the source: what the deployment committed, and what
// the controllers created from it (owned, labelled, with status).
var fixture = []struct {
	doc    string
	owner  string // kind/name of the owner, in this list
	status string
}{
	{doc: `{apiVersion: capstan.dev/v1alpha1, kind: ClusterDeployment, metadata: {name: mgmt}, spec: {path: clusters/mgmt, profile: capm3}}`},
	{doc: `{apiVersion: v1, kind: Secret, metadata: {name: mgmt-cp-0-bmc}, stringData: {username: admin, password: s3cret}}`},
	{doc: `{apiVersion: metal3.io/v1alpha1, kind: BareMetalHost, metadata: {name: mgmt-cp-0, finalizers: [baremetalhost.metal3.io]},
	  spec: {online: true, bootMACAddress: "00:00:5e:00:02:0a", bmc: {address: "redfish-virtualmedia://192.0.2.10/redfish/v1/Systems/1", credentialsName: mgmt-cp-0-bmc}}}`,
		status: `{errorCount: 0, errorMessage: "", operationalStatus: OK, poweredOn: true, provisioning: {ID: "5f3e", state: provisioned}}`},
	{doc: `{apiVersion: cluster.x-k8s.io/v1beta2, kind: Cluster, metadata: {name: mgmt, finalizers: [cluster.cluster.x-k8s.io]},
	  spec: {controlPlaneRef: {apiGroup: controlplane.cluster.x-k8s.io, kind: KubeadmControlPlane, name: mgmt}, infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: Metal3Cluster, name: mgmt}}}`,
		status: `{phase: Provisioned, initialization: {infrastructureProvisioned: true, controlPlaneInitialized: true}}`},
	{doc: `{apiVersion: infrastructure.cluster.x-k8s.io/v1beta2, kind: Metal3Cluster, metadata: {name: mgmt}, spec: {controlPlaneEndpoint: {host: 192.0.2.100, port: 6443}}}`, owner: "Cluster/mgmt"},
	{doc: `{apiVersion: controlplane.cluster.x-k8s.io/v1beta2, kind: KubeadmControlPlane, metadata: {name: mgmt, labels: {cluster.x-k8s.io/cluster-name: mgmt}},
	  spec: {version: v1.35.4, machineTemplate: {spec: {infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: Metal3MachineTemplate, name: mgmt-cp}}}}}`,
		owner: "Cluster/mgmt", status: `{replicas: 1, readyReplicas: 1}`},
	{doc: `{apiVersion: v1, kind: Secret, metadata: {name: mgmt-kubeconfig, labels: {cluster.x-k8s.io/cluster-name: mgmt}}, stringData: {value: "apiVersion: v1\nkind: Config\n"}}`, owner: "KubeadmControlPlane/mgmt"},
	{doc: `{apiVersion: cluster.x-k8s.io/v1beta2, kind: Machine, metadata: {name: mgmt-abcde, finalizers: [machine.cluster.x-k8s.io], labels: {cluster.x-k8s.io/cluster-name: mgmt}},
	  spec: {clusterName: mgmt, version: v1.35.4, bootstrap: {dataSecretName: mgmt-abcde}, infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: Metal3Machine, name: mgmt-abcde}}}`,
		owner: "KubeadmControlPlane/mgmt", status: `{phase: Running, nodeRef: {name: mgmt-abcde}}`},
	{doc: `{apiVersion: infrastructure.cluster.x-k8s.io/v1beta2, kind: Metal3Machine, metadata: {name: mgmt-abcde, labels: {cluster.x-k8s.io/cluster-name: mgmt}},
	  spec: {providerID: "metal3://mgmt/mgmt-cp-0/mgmt-abcde"}}`, owner: "Machine/mgmt-abcde"},
	// Not the deployment's: it stays where it is.
	{doc: `{apiVersion: v1, kind: ConfigMap, metadata: {name: unrelated}, data: {a: b}}`},
}

// committed are the fixture's objects that the deployment applied.
var committed = []string{"ClusterDeployment/mgmt", "Secret/mgmt-cp-0-bmc", "BareMetalHost/mgmt-cp-0", "Cluster/mgmt", "Metal3Cluster/mgmt", "KubeadmControlPlane/mgmt"}

// writeFixture creates the fixture in a new namespace of the source and
// returns the namespace and the deployment's objects.
func writeFixture(t *testing.T, c client.Client) (string, []Object) {
	t.Helper()
	ns, err := sourceEnv.CreateNamespace(t.Context(), "move")
	if err != nil {
		t.Fatal(err)
	}
	created := map[string]*unstructured.Unstructured{}
	for _, f := range fixture {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(f.doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		u.SetNamespace(ns)
		if f.owner != "" {
			ownedBy(created[f.owner])(u)
		}
		if slices.Contains(committed, u.GetKind()+"/"+u.GetName()) && u.GetKind() != "ClusterDeployment" {
			labels := u.GetLabels()
			if labels == nil {
				labels = map[string]string{}
			}
			labels[appliedByName], labels[appliedByNamespace] = "mgmt", ns
			u.SetLabels(labels)
		}
		if err := c.Create(t.Context(), u); err != nil {
			t.Fatalf("create %s: %v", ObjectOf(u), err)
		}
		if f.status != "" {
			var status map[string]any
			if err := yaml.Unmarshal([]byte(f.status), &status); err != nil {
				t.Fatal(err)
			}
			u.Object["status"] = status
			if err := c.Status().Update(t.Context(), u); err != nil {
				t.Fatalf("status of %s: %v", ObjectOf(u), err)
			}
		}
		created[u.GetKind()+"/"+u.GetName()] = u
	}
	var roots []Object
	for _, name := range committed {
		roots = append(roots, ObjectOf(created[name]))
	}
	return ns, roots
}

func clients(t *testing.T) (source, target client.Client) {
	t.Helper()
	var err error
	if source, err = client.New(sourceEnv.Config, client.Options{}); err != nil {
		t.Fatal(err)
	}
	if target, err = client.New(targetEnv.Config, client.Options{}); err != nil {
		t.Fatal(err)
	}
	return source, target
}

// listAll lists every object of the fixture's kinds in ns.
func listAll(t *testing.T, c client.Client, ns string) []*unstructured.Unstructured {
	t.Helper()
	seen := map[string]bool{}
	var out []*unstructured.Unstructured
	for _, f := range fixture {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(f.doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		if seen[u.GetAPIVersion()+u.GetKind()] {
			continue
		}
		seen[u.GetAPIVersion()+u.GetKind()] = true
		list := &unstructured.UnstructuredList{}
		list.SetAPIVersion(u.GetAPIVersion())
		list.SetKind(u.GetKind() + "List")
		if err := c.List(t.Context(), list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for i := range list.Items {
			out = append(out, &list.Items[i])
		}
	}
	return out
}

// graphAt builds the graph a move resumed after last would build.
func graphAt(t *testing.T, source, target client.Client, ns string, roots []Object, last Step) *Graph {
	t.Helper()
	c := source
	if last != "" && slices.Index(Steps, last) >= slices.Index(Steps, StepCopy) {
		c = target
	}
	g, err := BuildGraph(listAll(t, c, ns), roots)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

var errCrash = errors.New("crash")

// testTargetID stands for the target Capstan's identity in the fencing
// records a move hands over.
const testTargetID = "target-id"

// moveCrashingAt moves ns through Run, the one driver, crashing once
// when crash returns true, then running it again, which resumes after
// the phase status.pivot records, as a restarted daemon would.
func moveCrashingAt(t *testing.T, ns string, _ []Object, crash func(Step, Object) bool) (crashed bool) {
	t.Helper()
	source, target := clients(t)
	move := Move{
		Namespace: ns, Name: "mgmt",
		Source:   Cluster{Name: "source", Client: source, Discovery: discoveryOf(t, sourceEnv.Config)},
		Target:   Cluster{Name: "target", Client: target, Discovery: discoveryOf(t, targetEnv.Config)},
		TargetID: testTargetID,
		Touched: func(s Step, o Object) error {
			if !crashed && crash(s, o) {
				crashed = true
				return errCrash
			}
			return nil
		},
	}
	for attempt := 0; attempt < 2; attempt++ {
		_, err := Run(context.Background(), move)
		if err == nil {
			return crashed
		}
		if !errors.Is(err, errCrash) {
			t.Fatalf("move (attempt %d): %v", attempt+1, err)
		}
	}
	t.Fatal("the resumed move crashed again")
	return crashed
}

// assertMoved checks the end state of a move: every object of the graph
// exists once in the target, owner references point at the target's
// owners, status came along, nothing is paused there; the source keeps
// the Cluster, the Machine and the deployment as paused mirrors and
// nothing else of the deployment, and the unrelated ConfigMap stays.
func assertMoved(t *testing.T, ns string) {
	t.Helper()
	source, target := clients(t)
	// Both fencing records name the target, handed over once.
	for side, c := range map[string]client.Client{"source": source, "target": target} {
		lease := &coordinationv1.Lease{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: FenceName("mgmt")}, lease); err != nil {
			t.Errorf("fencing record in the %s: %v", side, err)
			continue
		}
		if h, g := ptr.Deref(lease.Spec.HolderIdentity, ""), ptr.Deref(lease.Spec.LeaseTransitions, -1); h != testTargetID || g != 1 {
			t.Errorf("fencing record in the %s: holder %q at handover %d; want %q at 1", side, h, g, testTargetID)
		}
	}
	moved := listAll(t, target, ns)
	byName := map[string]*unstructured.Unstructured{}
	for _, u := range moved {
		byName[u.GetKind()+"/"+u.GetName()] = u
	}
	for _, f := range fixture[:len(fixture)-1] {
		u := &unstructured.Unstructured{}
		_ = yaml.Unmarshal([]byte(f.doc), &u.Object)
		got, ok := byName[u.GetKind()+"/"+u.GetName()]
		if !ok {
			t.Errorf("%s/%s is not in the target", u.GetKind(), u.GetName())
			continue
		}
		for _, ref := range got.GetOwnerReferences() {
			owner, ok := byName[ref.Kind+"/"+ref.Name]
			if !ok || owner.GetUID() != ref.UID {
				t.Errorf("%s in the target is owned by %s/%s %s, which is not the target's", ObjectOf(got), ref.Kind, ref.Name, ref.UID)
			}
		}
		if f.owner != "" && len(got.GetOwnerReferences()) != 1 {
			t.Errorf("%s in the target has owners %v, want its one owner", ObjectOf(got), got.GetOwnerReferences())
		}
		if f.status != "" && got.Object["status"] == nil {
			t.Errorf("%s in the target has no status", ObjectOf(got))
		}
	}
	if _, ok := byName["ConfigMap/unrelated"]; ok {
		t.Error("ConfigMap unrelated moved; it is not the deployment's")
	}
	if paused, _, _ := unstructured.NestedBool(byName["Cluster/mgmt"].Object, "spec", "paused"); paused {
		t.Error("Cluster mgmt is paused in the target")
	}
	host := byName["BareMetalHost/mgmt-cp-0"]
	if _, ok := host.GetAnnotations()[HostPausedAnnotation]; ok {
		t.Error("BareMetalHost mgmt-cp-0 is paused in the target")
	}
	if state, _, _ := unstructured.NestedString(host.Object, "status", "provisioning", "state"); state != "provisioned" {
		t.Errorf("BareMetalHost mgmt-cp-0 is %q in the target, want its status copied (provisioned)", state)
	}
	if _, ok := host.GetAnnotations()[HostStatusAnnotation]; !ok {
		t.Error("BareMetalHost mgmt-cp-0 carries no status annotation for BMO to restore")
	}

	left := map[string]*unstructured.Unstructured{}
	for _, u := range listAll(t, source, ns) {
		left[u.GetKind()+"/"+u.GetName()] = u
	}
	names := make([]string, 0, len(left))
	for n := range left {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"Cluster/mgmt", "ClusterDeployment/mgmt", "ConfigMap/unrelated", "Machine/mgmt-abcde"}
	if !slices.Equal(names, want) {
		t.Errorf("the source keeps %v, want %v", names, want)
	}
	for _, name := range []string{"Cluster/mgmt", "Machine/mgmt-abcde", "ClusterDeployment/mgmt"} {
		u := left[name]
		if u == nil {
			continue
		}
		if u.GetAnnotations()[MirrorAnnotation] != "target" || len(u.GetOwnerReferences()) > 0 {
			t.Errorf("%s in the source: annotations %v, owners %v; want a mirror of the target without owners", name, u.GetAnnotations(), u.GetOwnerReferences())
		}
	}
	if paused, _, _ := unstructured.NestedBool(left["Cluster/mgmt"].Object, "spec", "paused"); !paused {
		t.Error("the mirror of Cluster mgmt in the source is not paused")
	}
	if suspended, _, _ := unstructured.NestedBool(left["ClusterDeployment/mgmt"].Object, "spec", "suspend"); !suspended {
		t.Error("the ClusterDeployment in the source is not suspended: its Capstan would act on the moved cluster")
	}
	if suspended, _, _ := unstructured.NestedBool(byName["ClusterDeployment/mgmt"].Object, "spec", "suspend"); suspended {
		t.Error("the ClusterDeployment in the target is suspended")
	}
}

func TestMoveUninterrupted(t *testing.T) {
	source, _ := clients(t)
	ns, roots := writeFixture(t, source)
	moveCrashingAt(t, ns, roots, func(Step, Object) bool { return false })
	assertMoved(t, ns)
}

// A move killed after any object of any step, then resumed from the last
// step it recorded, ends as an uninterrupted move: nothing lost, nothing
// twice, nothing left paused.
func TestMoveResumesAfterACrashAnywhere(t *testing.T) {
	// Where to crash: after the n-th object of a step (the fixture pauses
	// 3 objects, copies 9 and deletes 6 from the source).
	points := []struct {
		step Step
		n    int
	}{
		{StepPause, 1}, {StepPause, 3},
		{StepCopy, 1}, {StepCopy, 4}, {StepCopy, 9},
		{StepUnpause, 1}, {StepUnpause, 3},
		{StepCleanSource, 1}, {StepCleanSource, 3}, {StepCleanSource, 6},
	}
	for _, p := range points {
		t.Run(fmt.Sprintf("%s after %d", p.step, p.n), func(t *testing.T) {
			source, target := clients(t)
			ns, roots := writeFixture(t, source)
			count := 0
			crashed := moveCrashingAt(t, ns, roots, func(s Step, _ Object) bool {
				if s != p.step {
					return false
				}
				count++
				return count == p.n
			})
			if !crashed {
				t.Fatalf("the move never reached object %d of step %s (it did %d)", p.n, p.step, count)
			}
			assertMoved(t, ns)
			// No object twice: names are unique per kind, so a duplicate
			// would be a create error; check the count instead.
			if got, want := len(listAll(t, target, ns)), len(fixture)-1; got != want {
				t.Errorf("%d objects in the target, want %d", got, want)
			}
		})
	}
}

func TestMoveMissingSourceObjectMovesNothing(t *testing.T) {
	source, target := clients(t)
	ns, roots := writeFixture(t, source)
	roots = append(roots, Object{APIVersion: "metal3.io/v1alpha1", Kind: "BareMetalHost", Namespace: ns, Name: "mgmt-cp-9"})
	if _, err := BuildGraph(listAll(t, source, ns), roots); err == nil {
		t.Fatal("a move of a deployment with an object the source lacks was planned")
	}
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("cluster.x-k8s.io/v1beta2")
	u.SetKind("Cluster")
	if err := target.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "mgmt"}, u); !apierrors.IsNotFound(err) {
		t.Errorf("the target has Cluster mgmt (err %v); nothing should have moved", err)
	}
}

package pivot

import (
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// obj builds an object of the source cluster; its UID is its identity.
func obj(apiVersion, kind, name string, opts ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	u.SetNamespace("mgmt")
	u.SetName(name)
	u.SetUID(types.UID(kind + "/" + name))
	for _, o := range opts {
		o(u)
	}
	return u
}

func ownedBy(owner *unstructured.Unstructured) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		u.SetOwnerReferences(append(u.GetOwnerReferences(), metav1.OwnerReference{
			APIVersion: owner.GetAPIVersion(), Kind: owner.GetKind(), Name: owner.GetName(), UID: owner.GetUID(),
		}))
	}
}

func clusterLabel(name string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		u.SetLabels(map[string]string{ClusterNameLabel: name})
	}
}

func field(value string, path ...string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, value, path...)
	}
}

// source is a Metal3 management cluster the way the real controllers
// leave it (e2e/metal3): what the deployment committed, what Cluster API,
// KCP and CAPM3 created from it, and objects of another cluster and of
// nobody in the same namespace.
func source() (all []*unstructured.Unstructured, roots []Object) {
	cd := obj("capstan.dev/v1alpha1", "ClusterDeployment", "mgmt")
	cluster := obj("cluster.x-k8s.io/v1beta2", "Cluster", "mgmt")
	m3c := obj("infrastructure.cluster.x-k8s.io/v1beta2", "Metal3Cluster", "mgmt", ownedBy(cluster))
	kcp := obj("controlplane.cluster.x-k8s.io/v1beta2", "KubeadmControlPlane", "mgmt", ownedBy(cluster), clusterLabel("mgmt"))
	bmc := obj("v1", "Secret", "mgmt-cp-0-bmc")
	host := obj("metal3.io/v1alpha1", "BareMetalHost", "mgmt-cp-0", field("mgmt-cp-0-bmc", "spec", "bmc", "credentialsName"), field("mgmt-abcde-user-data", "spec", "userData", "name"), field("mgmt-cp-0-network", "spec", "networkData", "name"))
	network := obj("v1", "Secret", "mgmt-cp-0-network")
	// Created by the controllers, not committed.
	ca := obj("v1", "Secret", "mgmt-ca", clusterLabel("mgmt"), ownedBy(kcp))
	kubeconfig := obj("v1", "Secret", "mgmt-kubeconfig", clusterLabel("mgmt"), ownedBy(kcp))
	machine := obj("cluster.x-k8s.io/v1beta2", "Machine", "mgmt-abcde", clusterLabel("mgmt"), ownedBy(kcp))
	m3m := obj("infrastructure.cluster.x-k8s.io/v1beta2", "Metal3Machine", "mgmt-abcde", clusterLabel("mgmt"), ownedBy(machine))
	config := obj("bootstrap.cluster.x-k8s.io/v1beta2", "KubeadmConfig", "mgmt-abcde", clusterLabel("mgmt"), ownedBy(machine))
	userData := obj("v1", "Secret", "mgmt-abcde-user-data", ownedBy(m3m))
	// Someone else's.
	other := obj("cluster.x-k8s.io/v1beta2", "Cluster", "east")
	otherSecret := obj("v1", "Secret", "east-kubeconfig", clusterLabel("east"))
	loose := obj("v1", "ConfigMap", "unrelated")

	all = []*unstructured.Unstructured{cd, cluster, m3c, kcp, bmc, host, network, ca, kubeconfig, machine, m3m, config, userData, other, otherSecret, loose}
	for _, u := range []*unstructured.Unstructured{cd, cluster, m3c, kcp, bmc, host} {
		roots = append(roots, ObjectOf(u))
	}
	return all, roots
}

func names(nodes []*Node) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.ID().String()
	}
	return out
}

func TestBuildGraphFindsWhatMovesAndWhy(t *testing.T) {
	all, roots := source()
	g, err := BuildGraph(all, roots)
	if err != nil {
		t.Fatal(err)
	}
	why := map[string]string{}
	for _, n := range g.Nodes() {
		why[n.ID().String()] = n.Why
	}
	for _, row := range []struct{ object, why string }{
		{"ClusterDeployment/mgmt/mgmt", "committed"},
		{"BareMetalHost/mgmt/mgmt-cp-0", "committed"},
		{"Secret/mgmt/mgmt-ca", "owned by KubeadmControlPlane/mgmt/mgmt"},
		{"Machine/mgmt/mgmt-abcde", "owned by KubeadmControlPlane/mgmt/mgmt"},
		{"Metal3Machine/mgmt/mgmt-abcde", "owned by Machine/mgmt/mgmt-abcde"},
		{"KubeadmConfig/mgmt/mgmt-abcde", "owned by Machine/mgmt/mgmt-abcde"},
		{"Secret/mgmt/mgmt-abcde-user-data", "owned by Metal3Machine/mgmt/mgmt-abcde"},
		{"Secret/mgmt/mgmt-cp-0-network", "named by BareMetalHost/mgmt/mgmt-cp-0 .spec.networkData.name"},
		{"Secret/mgmt/mgmt-cp-0-bmc", "committed"},
	} {
		if got, ok := why[row.object]; !ok {
			t.Errorf("%s does not move; it should (%s)", row.object, row.why)
		} else if got != row.why {
			t.Errorf("%s moves because %q, want %q", row.object, got, row.why)
		}
	}
	for _, stays := range []string{"Cluster/mgmt/east", "Secret/mgmt/east-kubeconfig", "ConfigMap/mgmt/unrelated"} {
		if _, ok := why[stays]; ok {
			t.Errorf("%s would move, but it belongs to no object of the deployment", stays)
		}
	}
	if g.Len() != 13 {
		t.Errorf("%d objects move, want 13: %v", g.Len(), names(g.Nodes()))
	}
}

func TestBuildGraphLabelledObjectsOfTheCluster(t *testing.T) {
	cluster := obj("cluster.x-k8s.io/v1beta2", "Cluster", "mgmt")
	// A MachineDeployment's MachineSet is owned, but a Secret the user
	// labelled is tied to the Cluster only by its label.
	labelled := obj("v1", "Secret", "mgmt-extra", clusterLabel("mgmt"))
	sameNameElsewhere := obj("v1", "Secret", "mgmt-extra-2", clusterLabel("mgmt"))
	sameNameElsewhere.SetNamespace("other")
	g, err := BuildGraph([]*unstructured.Unstructured{cluster, labelled, sameNameElsewhere}, []Object{ObjectOf(cluster)})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(g.Nodes()); !slices.Equal(got, []string{"Cluster/mgmt/mgmt", "Secret/mgmt/mgmt-extra"}) {
		t.Errorf("moves %v, want the Cluster and the Secret labelled with its name in its namespace", got)
	}
}

// The deployment's reporting credentials go with it: the Capstan in the
// target comments on pull requests and commits its status from then on.
func TestBuildGraphTakesTheDeploymentsReportSecrets(t *testing.T) {
	cd := obj("capstan.dev/v1alpha1", "ClusterDeployment", "mgmt",
		field("git-auth", "spec", "source", "git", "secretRef", "name"),
		field("forge-token", "spec", "report", "pullRequests", "secretRef", "name"),
		field("status-push", "spec", "report", "gitStatus", "secretRef", "name"))
	all := []*unstructured.Unstructured{cd, obj("v1", "Secret", "git-auth"), obj("v1", "Secret", "forge-token"), obj("v1", "Secret", "status-push")}
	g, err := BuildGraph(all, []Object{ObjectOf(cd)})
	if err != nil {
		t.Fatal(err)
	}
	why := map[string]string{}
	for _, n := range g.Nodes() {
		why[n.ID().String()] = n.Why
	}
	for object, want := range map[string]string{
		"Secret/mgmt/git-auth":    "named by ClusterDeployment/mgmt/mgmt .spec.source.git.secretRef.name",
		"Secret/mgmt/forge-token": "named by ClusterDeployment/mgmt/mgmt .spec.report.pullRequests.secretRef.name",
		"Secret/mgmt/status-push": "named by ClusterDeployment/mgmt/mgmt .spec.report.gitStatus.secretRef.name",
	} {
		if got, ok := why[object]; !ok || got != want {
			t.Errorf("%s moves: %t, because %q; want it moved because %q", object, ok, got, want)
		}
	}
}

func TestBuildGraphMissingRootsAreAllNamed(t *testing.T) {
	all, roots := source()
	roots = append(roots,
		Object{APIVersion: "metal3.io/v1alpha1", Kind: "BareMetalHost", Namespace: "mgmt", Name: "mgmt-cp-9"},
		Object{APIVersion: "v1", Kind: "Secret", Namespace: "mgmt", Name: "mgmt-cp-9-bmc"})
	_, err := BuildGraph(all, roots)
	if err == nil {
		t.Fatal("BuildGraph accepted roots the source does not have")
	}
	for _, want := range []string{"BareMetalHost/mgmt/mgmt-cp-9: not found", "Secret/mgmt/mgmt-cp-9-bmc: not found"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestBuildGraphRootInAnotherVersion(t *testing.T) {
	// The deployment committed the Cluster in v1beta1; the source lists
	// it in v1beta2. It is the same object.
	cluster := obj("cluster.x-k8s.io/v1beta2", "Cluster", "mgmt")
	root := ObjectOf(cluster)
	root.APIVersion = "cluster.x-k8s.io/v1beta1"
	if _, err := BuildGraph([]*unstructured.Unstructured{cluster}, []Object{root}); err != nil {
		t.Fatal(err)
	}
}

func TestCreateOrderPutsOwnersFirst(t *testing.T) {
	all, roots := source()
	g, err := BuildGraph(all, roots)
	if err != nil {
		t.Fatal(err)
	}
	order, err := g.CreateOrder()
	if err != nil {
		t.Fatal(err)
	}
	pos := map[*Node]int{}
	for i, n := range order {
		pos[n] = i
	}
	for _, n := range order {
		for _, o := range n.Owners {
			if pos[o] > pos[n] {
				t.Errorf("%s is created before its owner %s", n.ID(), o.ID())
			}
		}
	}
	got := names(order)
	want := []string{
		// No owners: Secrets, the host, the Cluster, the deployment last.
		"Secret/mgmt/mgmt-cp-0-bmc",
		"Secret/mgmt/mgmt-cp-0-network",
		"BareMetalHost/mgmt/mgmt-cp-0",
		"Cluster/mgmt/mgmt",
		"ClusterDeployment/mgmt/mgmt",
		// Owned by the Cluster.
		"KubeadmControlPlane/mgmt/mgmt",
		"Metal3Cluster/mgmt/mgmt",
		// Owned by KCP.
		"Secret/mgmt/mgmt-ca",
		"Secret/mgmt/mgmt-kubeconfig",
		"Machine/mgmt/mgmt-abcde",
		// Owned by the Machine, then by the Metal3Machine.
		"KubeadmConfig/mgmt/mgmt-abcde",
		"Metal3Machine/mgmt/mgmt-abcde",
		"Secret/mgmt/mgmt-abcde-user-data",
	}
	if !slices.Equal(got, want) {
		t.Errorf("create order:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	del, err := g.DeleteOrder()
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(want)
	if got := names(del); !slices.Equal(got, want) {
		t.Errorf("delete order %v, want the create order reversed", got)
	}
}

func TestCreateOrderNamesACycle(t *testing.T) {
	a := obj("example.com/v1", "Widget", "a")
	b := obj("example.com/v1", "Widget", "b", ownedBy(a))
	ownedBy(b)(a)
	g, err := BuildGraph([]*unstructured.Unstructured{a, b}, []Object{ObjectOf(a)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.CreateOrder(); err == nil || !strings.Contains(err.Error(), "cycle among Widget/mgmt/a, Widget/mgmt/b") {
		t.Errorf("CreateOrder = %v, want the cycle named", err)
	}
}

func TestPauseTargets(t *testing.T) {
	all, roots := source()
	g, err := BuildGraph(all, roots)
	if err != nil {
		t.Fatal(err)
	}
	if got := names(g.PauseTargets()); !slices.Equal(got, []string{"BareMetalHost/mgmt/mgmt-cp-0", "Cluster/mgmt/mgmt", "ClusterDeployment/mgmt/mgmt"}) {
		t.Errorf("pause %v, want the host, the Cluster and the deployment", got)
	}
}

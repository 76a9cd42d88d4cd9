package pivot

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// Labels and annotations the graph and the move read.
const (
	// ClusterNameLabel ties an object to its Cluster API Cluster without an
	// owner reference (Cluster API's soft ownership).
	ClusterNameLabel = "cluster.x-k8s.io/cluster-name"
	// HostPausedAnnotation stops the BareMetal Operator from acting on a
	// host; a move sets it in the source and clears it in the target.
	HostPausedAnnotation = "baremetalhost.metal3.io/paused"
	// HostStatusAnnotation carries a BareMetalHost's status through a move:
	// BMO restores the status from it in the target, as it cannot write
	// status on create.
	HostStatusAnnotation = "baremetalhost.metal3.io/status"
)

// Object is the identity of an object in a move: API version, kind,
// namespace and name, as a user reads them.
type Object struct {
	APIVersion, Kind, Namespace, Name string
}

func (o Object) String() string {
	if o.Namespace == "" {
		return o.Kind + "/" + o.Name
	}
	return o.Kind + "/" + o.Namespace + "/" + o.Name
}

// ObjectOf returns the identity of u.
func ObjectOf(u *unstructured.Unstructured) Object {
	return Object{APIVersion: u.GetAPIVersion(), Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName()}
}

// Node is one object of the move graph.
type Node struct {
	Object *unstructured.Unstructured
	// Owners are the nodes its ownerReferences name, in the graph.
	Owners []*Node
	// Why says why the object moves: a root, owned by another node, tied
	// to the Cluster by label, or referenced by another node's field.
	Why string
}

// ID is the node's identity.
func (n *Node) ID() Object { return ObjectOf(n.Object) }

// Graph is what moves with a deployment: its objects, what they own, the
// objects tied to its Clusters by label and the Secrets they reference.
type Graph struct {
	nodes []*Node
	byUID map[types.UID]*Node
}

// Nodes are the graph's objects, in no particular order.
func (g *Graph) Nodes() []*Node { return g.nodes }

// Len is the number of objects that move.
func (g *Graph) Len() int { return len(g.nodes) }

// BuildGraph finds what moves with the objects of roots (a deployment's
// own objects, and the deployment itself) among all, every object of the
// namespaces involved as the source cluster has them (with their UIDs and
// owner references). It adds, until nothing more is found: the objects
// owned by a node (ownerReferences, by UID), the objects labelled with
// the name of a Cluster in the graph (cluster.x-k8s.io/cluster-name), and
// the Secrets a node names (a BareMetalHost's BMC credentials, a
// Metal3Machine's user and network data). A root missing from all is an
// error, all of them at once: a move must not start without every object
// it was asked to move.
func BuildGraph(all []*unstructured.Unstructured, roots []Object) (*Graph, error) {
	g := &Graph{byUID: map[types.UID]*Node{}}
	index := map[Object]*unstructured.Unstructured{}
	children := map[types.UID][]*unstructured.Unstructured{}
	labelled := map[[2]string][]*unstructured.Unstructured{} // namespace, cluster name
	for _, u := range all {
		index[identity(ObjectOf(u))] = u
		for _, ref := range u.GetOwnerReferences() {
			children[ref.UID] = append(children[ref.UID], u)
		}
		if c := u.GetLabels()[ClusterNameLabel]; c != "" {
			key := [2]string{u.GetNamespace(), c}
			labelled[key] = append(labelled[key], u)
		}
	}
	var errs []error
	var queue []*Node
	add := func(u *unstructured.Unstructured, why string) {
		if _, ok := g.byUID[u.GetUID()]; ok || u.GetLabels()[BootstrapOnlyLabel] == "true" {
			// Bootstrap-only objects stay: they serve the building
			// from the bootstrap, which deletes them after the handover.
			return
		}
		n := &Node{Object: u, Why: why}
		g.byUID[u.GetUID()] = n
		g.nodes = append(g.nodes, n)
		queue = append(queue, n)
	}
	for _, r := range roots {
		u, ok := index[identity(r)]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: not found in the source cluster", r))
			continue
		}
		add(u, "committed")
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("build the move graph: %w", errors.Join(errs...))
	}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		id := n.ID()
		for _, u := range children[n.Object.GetUID()] {
			add(u, "owned by "+id.String())
		}
		if id.Kind == "Cluster" && isClusterAPI(id.APIVersion) {
			for _, u := range labelled[[2]string{id.Namespace, id.Name}] {
				add(u, "labelled "+ClusterNameLabel+"="+id.Name)
			}
		}
		if id.Kind == "ClusterDeployment" {
			// The key Capstan generated for the deployment's machines
			// (a bootstrapKey stage) goes with it: the target's Capstan
			// would make a new one that no machine holds.
			if u, ok := index[identity(Object{APIVersion: "v1", Kind: "Secret", Namespace: id.Namespace, Name: BootstrapKeySecret})]; ok {
				add(u, "the bootstrap key of "+id.String())
			}
		}
		for _, ref := range secretRefs(n.Object) {
			if u, ok := index[identity(Object{APIVersion: "v1", Kind: "Secret", Namespace: id.Namespace, Name: ref.name})]; ok {
				add(u, fmt.Sprintf("named by %s %s", id, ref.field))
			}
		}
	}
	for _, n := range g.nodes {
		for _, ref := range n.Object.GetOwnerReferences() {
			if o, ok := g.byUID[ref.UID]; ok {
				n.Owners = append(n.Owners, o)
			}
		}
		// Ownership says more than a label found first: it is what orders
		// the move.
		if n.Why != "committed" && len(n.Owners) > 0 {
			n.Why = "owned by " + n.Owners[0].ID().String()
		}
	}
	return g, nil
}

// identity drops the version: the same object read in two versions is one.
func identity(o Object) Object {
	group, _, _ := strings.Cut(o.APIVersion, "/")
	if !strings.Contains(o.APIVersion, "/") {
		group = ""
	}
	return Object{APIVersion: group, Kind: o.Kind, Namespace: o.Namespace, Name: o.Name}
}

// BootstrapOnlyLabel marks an object that serves only the building of a
// cluster from the bootstrap cluster: it never moves, and a pivot stage
// deletes it from the bootstrap once the target's Capstan took over.
const BootstrapOnlyLabel = "capstan.dev/bootstrap-only"

// BootstrapKeySecret is the Secret in a deployment's namespace holding the
// SSH key Capstan generated for its machines (stages.BootstrapKeySecret).
const BootstrapKeySecret = "capstan-bootstrap-key"

func isClusterAPI(apiVersion string) bool {
	return strings.HasPrefix(apiVersion, "cluster.x-k8s.io/")
}

type secretRef struct{ field, name string }

// secretRefs are the Secrets an object names in its spec, in the same
// namespace, for the kinds whose Secrets Cluster API does not label, and
// for the ClusterDeployment: its source's credentials and signature keys,
// the kubeconfigs its stages use, and what it reports with (the forge
// token of its pull request comments, the push credentials of its status
// commits) and the sops keys it decrypts with, which the Capstan in the
// target needs to go on.
func secretRefs(u *unstructured.Unstructured) []secretRef {
	var fields [][]string
	switch u.GetKind() {
	case "BareMetalHost":
		fields = [][]string{{"spec", "bmc", "credentialsName"}, {"spec", "userData", "name"}, {"spec", "networkData", "name"}, {"spec", "metaData", "name"}}
	case "Metal3Machine":
		fields = [][]string{{"spec", "userData", "name"}, {"spec", "networkData", "name"}, {"spec", "metaData", "name"}}
	case "ClusterDeployment":
		fields = [][]string{
			{"spec", "source", "git", "secretRef", "name"}, {"spec", "source", "git", "verify", "secretRef", "name"},
			{"spec", "source", "oci", "secretRef", "name"}, {"spec", "source", "oci", "verify", "secretRef", "name"},
			{"spec", "kubeConfig", "secretRef", "name"},
			{"spec", "report", "pullRequests", "secretRef", "name"}, {"spec", "report", "gitStatus", "secretRef", "name"},
			{"spec", "decryption", "secretRef", "name"},
		}
		stages, _, _ := unstructured.NestedSlice(u.Object, "spec", "stages")
		var refs []secretRef
		for i, st := range stages {
			m, _ := st.(map[string]any)
			if name, _, _ := unstructured.NestedString(m, "kubeConfig", "secretRef", "name"); name != "" {
				refs = append(refs, secretRef{field: fmt.Sprintf(".spec.stages[%d].kubeConfig.secretRef.name", i), name: name})
			}
		}
		for _, f := range fields {
			if name, _, _ := unstructured.NestedString(u.Object, f...); name != "" {
				refs = append(refs, secretRef{field: "." + strings.Join(f, "."), name: name})
			}
		}
		return refs
	}
	var refs []secretRef
	for _, f := range fields {
		if name, _, _ := unstructured.NestedString(u.Object, f...); name != "" {
			refs = append(refs, secretRef{field: "." + strings.Join(f, "."), name: name})
		}
	}
	return refs
}

// kindRank orders objects without owners among themselves: what others
// read first (Secrets, ConfigMaps), the hosts, then the Cluster and the
// rest, so that a controller in the target finds what an object refers to.
func kindRank(kind string) int {
	switch kind {
	case "Namespace":
		return 0
	case "Secret", "ConfigMap":
		return 1
	case "BareMetalHost":
		return 2
	case "Cluster":
		return 3
	case "ClusterDeployment":
		return 9
	}
	return 5
}

// CreateOrder returns the nodes in the order a move creates them: every
// node after all of its owners (so that their new UIDs are known when its
// owner references are rewritten), and otherwise by kind and name, so a
// plan reads the same every time. Owner references that form a cycle are
// an error naming the objects.
func (g *Graph) CreateOrder() ([]*Node, error) {
	placed := map[*Node]bool{}
	var order []*Node
	remaining := slices.Clone(g.nodes)
	for len(remaining) > 0 {
		var ready, rest []*Node
		for _, n := range remaining {
			if !slices.ContainsFunc(n.Owners, func(o *Node) bool { return !placed[o] }) {
				ready = append(ready, n)
			} else {
				rest = append(rest, n)
			}
		}
		if len(ready) == 0 {
			names := make([]string, len(rest))
			for i, n := range rest {
				names[i] = n.ID().String()
			}
			slices.Sort(names)
			return nil, fmt.Errorf("owner references form a cycle among %s", strings.Join(names, ", "))
		}
		slices.SortFunc(ready, func(a, b *Node) int {
			return cmp.Or(
				cmp.Compare(kindRank(a.Object.GetKind()), kindRank(b.Object.GetKind())),
				cmp.Compare(a.Object.GetKind(), b.Object.GetKind()),
				cmp.Compare(a.Object.GetNamespace(), b.Object.GetNamespace()),
				cmp.Compare(a.Object.GetName(), b.Object.GetName()),
			)
		})
		for _, n := range ready {
			placed[n] = true
		}
		order = append(order, ready...)
		remaining = rest
	}
	return order, nil
}

// DeleteOrder is CreateOrder reversed: what an object owns goes before it.
func (g *Graph) DeleteOrder() ([]*Node, error) {
	order, err := g.CreateOrder()
	slices.Reverse(order)
	return order, err
}

// PauseTargets are the nodes a move pauses in the source before it copies
// anything: the Cluster API Clusters (spec.paused, which every Cluster API
// and CAPM3 controller honours), the BareMetalHosts (the BMO paused
// annotation) and the ClusterDeployments (spec.suspend), by kind and name.
func (g *Graph) PauseTargets() []*Node {
	var out []*Node
	for _, n := range g.nodes {
		id := n.ID()
		if (id.Kind == "Cluster" && isClusterAPI(id.APIVersion)) || id.Kind == "BareMetalHost" || id.Kind == "ClusterDeployment" {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b *Node) int { return cmp.Compare(a.ID().String(), b.ID().String()) })
	return out
}

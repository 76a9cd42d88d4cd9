package pivot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PreflightOptions tune Preflight.
type PreflightOptions struct {
	// Force allows the move while machines are provisioning or hosts are
	// being registered/inspected/provisioned/deprovisioned.
	Force bool
}

// PreflightCheck names one check of Preflight.
type PreflightCheck string

// The checks of Preflight, in the order it reports their problems.
const (
	// PreflightTargetReachable: the target answers. When it does not,
	// the checks that read it are skipped.
	PreflightTargetReachable PreflightCheck = "TargetReachable"
	// PreflightKindsServed: the target serves every apiVersion and kind
	// of the graph, or the copy would fail half-way.
	PreflightKindsServed PreflightCheck = "KindsServed"
	// PreflightNotMidOperation: no Cluster API Machine is provisioning and
	// no BareMetalHost is being registered, inspected, provisioned or
	// deprovisioned; PreflightOptions.Force overrides it.
	PreflightNotMidOperation PreflightCheck = "NotMidOperation"
	// PreflightNotBeingDeleted: no object of the graph is being deleted; a
	// move would bring it back to life in the target.
	PreflightNotBeingDeleted PreflightCheck = "NotBeingDeleted"
	// PreflightNoDeploymentInTarget: the target has no ClusterDeployment of
	// the same namespace and name that a move did not create; the copy
	// would take it as already copied.
	PreflightNoDeploymentInTarget PreflightCheck = "NoDeploymentInTarget"
)

// PreflightProblem is one reason a move may not start. Preflight joins
// them; PreflightProblems finds them again.
type PreflightProblem struct {
	// Check is the check that found it.
	Check PreflightCheck
	// Objects are the objects of the graph it concerns, none when it
	// concerns the target as a whole.
	Objects []Object
	// Message says what is wrong, naming the objects, and what to do.
	Message string
}

func (p *PreflightProblem) Error() string { return p.Message }

// Waiting reports whether the problem goes away without anyone changing
// either cluster: the target comes back, the machine finishes
// provisioning, the deletion completes. The other problems stall the move
// until someone installs CRDs in the target or removes a deployment there.
func (p *PreflightProblem) Waiting() bool {
	switch p.Check {
	case PreflightTargetReachable, PreflightNotMidOperation, PreflightNotBeingDeleted:
		return true
	}
	return false
}

// PreflightProblems returns the problems err joins or wraps, in order.
func PreflightProblems(err error) []*PreflightProblem {
	var out []*PreflightProblem
	var walk func(error)
	walk = func(err error) {
		if p, ok := err.(*PreflightProblem); ok {
			out = append(out, p)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

// Preflight checks, before anything is paused, that graph g can move into
// the target: every problem at once (an error that joins them, each naming
// the object and what to do), nil when the move may start.
//
// The checks of the source are pure functions of g's objects, as listed
// just before: whether a Machine or BareMetalHost is mid-operation and
// whether an object is being deleted. The target is asked once whether it
// answers and, if it does, which kinds it serves and whether it holds a
// ClusterDeployment of the graph that no move created. An error that is
// not a problem (ctx ended) is returned alone.
func Preflight(ctx context.Context, g *Graph, target client.Client, targetDisco discovery.DiscoveryInterface, opts PreflightOptions) error {
	var problems []*PreflightProblem
	reachable := checkReachable(ctx, targetDisco)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("preflight: %w", err)
	}
	if reachable != nil {
		problems = append(problems, reachable)
	} else {
		problems = append(problems, checkServed(g, targetDisco)...)
	}
	problems = append(problems, checkMidOperation(g, opts.Force)...)
	problems = append(problems, checkBeingDeleted(g)...)
	if reachable == nil {
		problems = append(problems, checkDeploymentsInTarget(ctx, g, target)...)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("preflight: %w", err)
	}
	errs := make([]error, len(problems))
	for i, p := range problems {
		errs[i] = p
	}
	return errors.Join(errs...)
}

// checkReachable asks the target for its version, with ctx when the
// discovery client exposes its REST client (ServerVersion takes none).
func checkReachable(ctx context.Context, d discovery.DiscoveryInterface) *PreflightProblem {
	var err error
	if rc := d.RESTClient(); rc != nil {
		_, err = rc.Get().AbsPath("/version").Do(ctx).Raw()
	} else {
		_, err = d.ServerVersion()
	}
	if err == nil {
		return nil
	}
	return &PreflightProblem{Check: PreflightTargetReachable,
		Message: fmt.Sprintf("the target cannot be reached: %v; check the kubeconfig that names it and that its API server is up (the target's other checks were skipped)", err)}
}

// checkServed returns one problem per apiVersion and kind of the graph
// that the target does not serve, naming what it serves of the group.
func checkServed(g *Graph, d discovery.DiscoveryInterface) []*PreflightProblem {
	byKind := map[schema.GroupVersionKind][]Object{}
	for _, n := range g.Nodes() {
		gvk := n.Object.GroupVersionKind()
		byKind[gvk] = append(byKind[gvk], n.ID())
	}
	kinds := slices.SortedFunc(maps.Keys(byKind), func(a, b schema.GroupVersionKind) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Group, b.Group), cmp.Compare(a.Version, b.Version))
	})
	if len(kinds) == 0 {
		return nil
	}
	groups, err := d.ServerGroups()
	if err != nil {
		return []*PreflightProblem{{Check: PreflightKindsServed,
			Message: fmt.Sprintf("list the API groups the target serves: %v", err)}}
	}
	versions := map[string][]string{} // group -> served versions, preferred first
	for _, grp := range groups.Groups {
		for _, v := range grp.Versions {
			if v.Version == grp.PreferredVersion.Version {
				versions[grp.Name] = append([]string{v.Version}, versions[grp.Name]...)
			} else {
				versions[grp.Name] = append(versions[grp.Name], v.Version)
			}
		}
	}
	resources := map[schema.GroupVersion]*metav1.APIResourceList{}
	var problems []*PreflightProblem
	for _, gvk := range kinds {
		objects := byKind[gvk]
		gv := gvk.GroupVersion()
		served := versions[gvk.Group]
		var why string
		switch {
		case len(served) == 0:
			why = fmt.Sprintf("the target serves no version of %s; %s", groupName(gvk.Group), installHint(gvk.Group))
		case !slices.Contains(served, gvk.Version):
			why = fmt.Sprintf("the target serves %s only; %s, in a release that serves %s", versionList(gvk.Group, served), installHint(gvk.Group), gv)
		default:
			list, ok := resources[gv]
			if !ok {
				list, err = d.ServerResourcesForGroupVersion(gv.String())
				if err != nil && !apierrors.IsNotFound(err) {
					problems = append(problems, &PreflightProblem{Check: PreflightKindsServed, Objects: objects,
						Message: fmt.Sprintf("%s: list the kinds the target serves in %s: %v", kindObjects(gvk, objects), gv, err)})
					continue
				}
				resources[gv] = list
			}
			if list != nil && slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool {
				return r.Kind == gvk.Kind && !strings.Contains(r.Name, "/")
			}) {
				continue
			}
			why = fmt.Sprintf("the target serves %s, but not kind %s in it; %s", gv, gvk.Kind, installHint(gvk.Group))
		}
		problems = append(problems, &PreflightProblem{Check: PreflightKindsServed, Objects: objects,
			Message: kindObjects(gvk, objects) + ": " + why})
	}
	return problems
}

// maxNamed is how many objects a problem about a kind names; the rest are
// counted.
const maxNamed = 3

// kindObjects names a kind and, up to maxNamed, its objects:
// "BareMetalHost (metal3.io/v1alpha1, 100 objects: ns/a, ns/b, ns/c and 97 more)".
func kindObjects(gvk schema.GroupVersionKind, objects []Object) string {
	names := make([]string, len(objects))
	for i, o := range objects {
		names[i] = o.Name
		if o.Namespace != "" {
			names[i] = o.Namespace + "/" + o.Name
		}
	}
	slices.Sort(names)
	names = names[:min(len(names), maxNamed)]
	list := strings.Join(names, ", ")
	if more := len(objects) - len(names); more > 0 {
		list += fmt.Sprintf(" and %d more", more)
	}
	count := "1 object"
	if len(objects) != 1 {
		count = fmt.Sprintf("%d objects", len(objects))
	}
	return fmt.Sprintf("%s (%s, %s: %s)", gvk.Kind, gvk.GroupVersion(), count, list)
}

func groupName(group string) string {
	if group == "" {
		return "the core API"
	}
	return group
}

// versionList writes the versions of a group as apiVersions: "g/v1, g/v2".
func versionList(group string, versions []string) string {
	out := make([]string, len(versions))
	for i, v := range versions {
		out[i] = schema.GroupVersion{Group: group, Version: v}.String()
	}
	return strings.Join(out, ", ")
}

// busyMachinePhases are the Cluster API Machine phases (status.phase) in
// which a controller is creating or deleting the machine's infrastructure:
// a move pauses that half-way and the target's controllers start over
// from a copy of a moment.
var busyMachinePhases = []string{"Pending", "Provisioning", "Deleting"}

// busyHostStates are the BareMetal Operator's provisioning states
// (status.provisioning.state, baremetal-operator apis v0.13
// ProvisioningState) in which Ironic is acting on the machine: registering
// it, inspecting it, cleaning or configuring it, writing or wiping its
// disks, powering it off to delete it. The others (unmanaged, available,
// ready, provisioned, externally provisioned, and none yet) are at rest.
var busyHostStates = []string{
	"registering", "match profile", "inspecting", "preparing", "provisioning",
	"deprovisioning", "powering off before delete", "deleting",
}

// midOperation says whether u, a Cluster API Machine or a Metal3
// BareMetalHost, is in the middle of an operation a move would cut short,
// and which: the Machine's phase or the host's provisioning state. An
// object being deleted is left to the check of deletions, which no
// option overrides.
func midOperation(u *unstructured.Unstructured) (state string, busy bool) {
	if u.GetDeletionTimestamp() != nil {
		return "", false
	}
	gv, _ := schema.ParseGroupVersion(u.GetAPIVersion())
	switch {
	case u.GetKind() == "Machine" && gv.Group == "cluster.x-k8s.io":
		state, _, _ = unstructured.NestedString(u.Object, "status", "phase")
		return state, slices.Contains(busyMachinePhases, state)
	case u.GetKind() == "BareMetalHost" && gv.Group == "metal3.io":
		state, _, _ = unstructured.NestedString(u.Object, "status", "provisioning", "state")
		return state, slices.Contains(busyHostStates, state)
	}
	return "", false
}

// checkMidOperation returns one problem per Machine or host of the graph
// mid-operation, unless force.
func checkMidOperation(g *Graph, force bool) []*PreflightProblem {
	if force {
		return nil
	}
	var problems []*PreflightProblem
	for _, n := range sortedNodes(g) {
		state, busy := midOperation(n.Object)
		if !busy {
			continue
		}
		problems = append(problems, &PreflightProblem{Check: PreflightNotMidOperation, Objects: []Object{n.ID()},
			Message: fmt.Sprintf("%s is %s: a move now would cut that short; wait until it %s, or move anyway with --force (pivot: {force: true} in a pivot stage)",
				n.ID(), quoteState(state), settlesAs(state))})
	}
	return problems
}

// settlesAs says where a busy Machine phase or host state leads.
func settlesAs(state string) string {
	switch state {
	case "Pending", "Provisioning":
		return "is Running"
	case "provisioning":
		return "is provisioned"
	case "Deleting", "powering off before delete", "deleting":
		return "is gone"
	}
	return "is available" // registering, inspecting, preparing, deprovisioning
}

// quoteState quotes BMO's states with spaces so they read as one.
func quoteState(s string) string {
	if strings.Contains(s, " ") {
		return fmt.Sprintf("%q", s)
	}
	return s
}

// checkBeingDeleted returns one problem per object of the graph being
// deleted: the copy would create it again in the target, alive.
func checkBeingDeleted(g *Graph) []*PreflightProblem {
	var problems []*PreflightProblem
	for _, n := range sortedNodes(g) {
		ts := n.Object.GetDeletionTimestamp()
		if ts == nil {
			continue
		}
		held := ""
		if f := n.Object.GetFinalizers(); len(f) > 0 {
			held = ", held by the finalizers " + strings.Join(f, ", ")
		}
		problems = append(problems, &PreflightProblem{Check: PreflightNotBeingDeleted, Objects: []Object{n.ID()},
			Message: fmt.Sprintf("%s is being deleted (since %s%s): a move would create it again in the target; wait until the deletion completes, then run the move again (--force does not override this)",
				n.ID(), ts.UTC().Format(time.RFC3339), held)})
	}
	return problems
}

// checkDeploymentsInTarget returns a problem for each ClusterDeployment of
// the graph that the target already has and that no move created: the
// copy takes an object the target has as copied, so the target would go
// on with its own deployment, not the one moved.
func checkDeploymentsInTarget(ctx context.Context, g *Graph, target client.Client) []*PreflightProblem {
	var problems []*PreflightProblem
	for _, n := range sortedNodes(g) {
		if n.Object.GetKind() != "ClusterDeployment" {
			continue
		}
		existing := &unstructured.Unstructured{}
		existing.SetGroupVersionKind(n.Object.GroupVersionKind())
		err := target.Get(ctx, client.ObjectKeyFromObject(n.Object), existing)
		switch {
		case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
			// Not there, or its kind not served: checkServed says so.
			continue
		case err != nil:
			problems = append(problems, &PreflightProblem{Check: PreflightNoDeploymentInTarget, Objects: []Object{n.ID()},
				Message: fmt.Sprintf("read %s in the target: %v", n.ID(), err)})
			continue
		}
		if _, arrived := existing.GetAnnotations()[ArrivedAnnotation]; arrived {
			continue
		}
		problems = append(problems, &PreflightProblem{Check: PreflightNoDeploymentInTarget, Objects: []Object{n.ID()},
			Message: fmt.Sprintf("%s exists in the target already and no move created it (it lacks the annotation %s): the move would take it as copied and the target would go on with it instead of the one moved; delete it from the target first, or move into another cluster",
				n.ID(), ArrivedAnnotation)})
	}
	return problems
}

// sortedNodes are g's nodes by identity, so that problems read the same
// every time.
func sortedNodes(g *Graph) []*Node {
	nodes := slices.Clone(g.Nodes())
	slices.SortFunc(nodes, func(a, b *Node) int { return cmp.Compare(a.ID().String(), b.ID().String()) })
	return nodes
}

// installHint says how the CRDs of group get into the target.
func installHint(group string) string {
	if group == "capstan.dev" || strings.HasSuffix(group, ".capstan.dev") {
		return "install Capstan's CRDs there first (a Capstan that knows its image, capstan run --image, installs them before it moves; else capstan install --kubeconfig <target>)"
	}
	return "install the provider's CRDs there first"
}

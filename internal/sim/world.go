package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The API versions the simulator reads and writes: those Cluster API
// v1.14, CAPM3 v1.13 and the BareMetal Operator v0.13 store.
const (
	groupCluster      = "cluster.x-k8s.io"
	groupControlPlane = "controlplane.cluster.x-k8s.io"
	groupBootstrap    = "bootstrap.cluster.x-k8s.io"
	groupInfra        = "infrastructure.cluster.x-k8s.io"
	groupMetal3       = "metal3.io"
)

var (
	kindBareMetalHost         = schema.GroupVersionKind{Group: groupMetal3, Version: "v1alpha1", Kind: "BareMetalHost"}
	kindCluster               = schema.GroupVersionKind{Group: groupCluster, Version: "v1beta2", Kind: "Cluster"}
	kindMachine               = schema.GroupVersionKind{Group: groupCluster, Version: "v1beta2", Kind: "Machine"}
	kindMachineSet            = schema.GroupVersionKind{Group: groupCluster, Version: "v1beta2", Kind: "MachineSet"}
	kindMachineDeployment     = schema.GroupVersionKind{Group: groupCluster, Version: "v1beta2", Kind: "MachineDeployment"}
	kindKubeadmControlPlane   = schema.GroupVersionKind{Group: groupControlPlane, Version: "v1beta2", Kind: "KubeadmControlPlane"}
	kindKubeadmConfig         = schema.GroupVersionKind{Group: groupBootstrap, Version: "v1beta2", Kind: "KubeadmConfig"}
	kindKubeadmConfigTemplate = schema.GroupVersionKind{Group: groupBootstrap, Version: "v1beta2", Kind: "KubeadmConfigTemplate"}
	kindMetal3Cluster         = schema.GroupVersionKind{Group: groupInfra, Version: "v1beta2", Kind: "Metal3Cluster"}
	kindMetal3Machine         = schema.GroupVersionKind{Group: groupInfra, Version: "v1beta2", Kind: "Metal3Machine"}
	kindMetal3MachineTemplate = schema.GroupVersionKind{Group: groupInfra, Version: "v1beta2", Kind: "Metal3MachineTemplate"}
	kindMetal3DataTemplate    = schema.GroupVersionKind{Group: groupInfra, Version: "v1beta2", Kind: "Metal3DataTemplate"}
	kindMetal3DataClaim       = schema.GroupVersionKind{Group: groupInfra, Version: "v1beta2", Kind: "Metal3DataClaim"}
	kindMetal3Data            = schema.GroupVersionKind{Group: groupInfra, Version: "v1beta2", Kind: "Metal3Data"}
)

// watchedKinds are the kinds a pass reads; a change to any of them starts
// a pass over its namespace.
var watchedKinds = []schema.GroupVersionKind{
	kindBareMetalHost, kindCluster, kindMetal3Cluster, kindKubeadmControlPlane,
	kindMachineDeployment, kindMachineSet, kindMachine, kindKubeadmConfig,
	kindKubeadmConfigTemplate, kindMetal3Machine, kindMetal3MachineTemplate,
	kindMetal3DataTemplate, kindMetal3DataClaim, kindMetal3Data,
	kindIPPool, kindIPClaim, kindIPAddress,
}

// optionalKinds may be missing: the simulator then plays without them.
var optionalKinds = map[schema.GroupVersionKind]bool{kindIPPool: true, kindIPClaim: true, kindIPAddress: true}

// world is a pass's view of one namespace: every object of the watched
// kinds, kept up to date with the pass's own writes.
type world struct {
	objs map[schema.GroupVersionKind]map[string]*unstructured.Unstructured
}

func (w *world) list(gvk schema.GroupVersionKind) []*unstructured.Unstructured {
	m := w.objs[gvk]
	out := make([]*unstructured.Unstructured, 0, len(m))
	for _, o := range m {
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b *unstructured.Unstructured) int { return compareAge(a, b) })
	return out
}

func (w *world) get(gvk schema.GroupVersionKind, name string) *unstructured.Unstructured {
	if name == "" {
		return nil
	}
	return w.objs[gvk][name]
}

func (w *world) byUID(gvk schema.GroupVersionKind, uid types.UID) *unstructured.Unstructured {
	for _, o := range w.objs[gvk] {
		if o.GetUID() == uid {
			return o
		}
	}
	return nil
}

func (w *world) put(obj *unstructured.Unstructured) {
	gvk := obj.GroupVersionKind()
	if w.objs[gvk] == nil {
		w.objs[gvk] = map[string]*unstructured.Unstructured{}
	}
	w.objs[gvk][obj.GetName()] = obj
}

func (w *world) remove(obj *unstructured.Unstructured) {
	delete(w.objs[obj.GroupVersionKind()], obj.GetName())
}

// owned lists the objects of gvk whose controller is owner.
func (w *world) owned(gvk schema.GroupVersionKind, owner *unstructured.Unstructured) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range w.list(gvk) {
		if ref := controllerRef(o); ref != nil && ref.UID == owner.GetUID() {
			out = append(out, o)
		}
	}
	return out
}

// compareAge orders objects oldest first, then by name.
func compareAge(a, b *unstructured.Unstructured) int {
	ta, tb := a.GetCreationTimestamp(), b.GetCreationTimestamp()
	switch {
	case ta.Before(&tb):
		return -1
	case tb.Before(&ta):
		return 1
	case a.GetName() < b.GetName():
		return -1
	case a.GetName() > b.GetName():
		return 1
	}
	return 0
}

// pass is one round over a namespace: each simulated controller looks at
// every object it owns and takes the next step that is due.
type pass struct {
	ctx    context.Context
	s      *Simulator
	ns     string
	now    time.Time
	w      *world
	wake   time.Duration // when the next step falls due; zero when none waits
	writes []string      // what the pass wrote, for the V(2) log
}

// passSteps are the simulated controllers, in the order of seed 002. Each
// takes the steps that are due; the order only saves passes, since every
// write starts another pass.
var passSteps = []struct {
	name string
	run  func(*pass) error
}{
	{"BareMetalHost", (*pass).reconcileHosts},
	{"Metal3Cluster", (*pass).reconcileMetal3Clusters},
	{"Cluster", (*pass).reconcileClusters},
	{"KubeadmControlPlane", (*pass).reconcileControlPlanes},
	{"MachineDeployment", (*pass).reconcileMachineDeployments},
	{"MachineSet", (*pass).reconcileMachineSets},
	{"KubeadmConfig", (*pass).reconcileBootstrapConfigs},
	{"Metal3Machine", (*pass).reconcileMetal3Machines},
	{"Metal3DataTemplate", (*pass).reconcileDataTemplates},
	{"IPClaim", (*pass).reconcileIPClaims},
	{"Metal3Data", (*pass).reconcileData},
	{"Machine", (*pass).reconcileMachines},
	{"garbage", (*pass).collectOrphans},
}

// pass runs every simulated controller once over namespace ns. It returns
// when the next delayed step falls due (zero if none waits).
func (s *Simulator) pass(ctx context.Context, ns string) (time.Duration, error) {
	start := time.Now()
	w := &world{objs: map[schema.GroupVersionKind]map[string]*unstructured.Unstructured{}}
	for _, gvk := range watchedKinds {
		if !s.served(gvk) {
			continue
		}
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := s.client.List(ctx, list, client.InNamespace(ns)); err != nil {
			return 0, fmt.Errorf("list %s in %s: %w", gvk.Kind, ns, err)
		}
		for i := range list.Items {
			o := &list.Items[i]
			o.SetGroupVersionKind(gvk)
			w.put(o)
		}
	}
	p := &pass{ctx: ctx, s: s, ns: ns, now: time.Now(), w: w}
	var errs []error
	for _, step := range passSteps {
		if err := step.run(p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", step.name, err))
		}
	}
	s.log.V(2).Info("pass", "namespace", ns, "took", time.Since(start).String(), "writes", p.writes)
	return p.wake, errors.Join(errs...)
}

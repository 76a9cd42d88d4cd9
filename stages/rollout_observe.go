package stages

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
)

var (
	lcmMachineGVK = lcmv1.GroupVersion.WithKind(lcmv1.LCMMachineKind)
	lcmClusterGVK = lcmv1.GroupVersion.WithKind(lcmv1.LCMClusterKind)
	nodeListGVK   = corev1.SchemeGroupVersion.WithKind("NodeList")
)

// rolloutScope is what a rollout stage acts on: the LCMMachines and
// LCMClusters its selector picked from the rendered objects, by namespace.
// Machines are read live; a machine belongs to the LCMCluster its live
// spec.clusterName names, and one that names none is left alone.
type rolloutScope map[string]*namespaceScope

type namespaceScope struct {
	machines map[string]bool
	clusters map[string]bool
}

func rolloutScopeOf(stage *Stage) rolloutScope {
	scope := rolloutScope{}
	at := func(ns string) *namespaceScope {
		if scope[ns] == nil {
			scope[ns] = &namespaceScope{machines: map[string]bool{}, clusters: map[string]bool{}}
		}
		return scope[ns]
	}
	for _, obj := range stage.Objects {
		switch obj.GroupVersionKind().GroupKind() {
		case lcmMachineGVK.GroupKind():
			at(obj.GetNamespace()).machines[obj.GetName()] = true
		case lcmClusterGVK.GroupKind():
			at(obj.GetNamespace()).clusters[obj.GetName()] = true
		}
	}
	return scope
}

func (s rolloutScope) namespaces() []string {
	return slices.Sorted(maps.Keys(s))
}

// observeRollout reads the clusters of the scope, their machines, and the
// Nodes the machines report, in one pass of lists.
func (e *Executor) observeRollout(ctx context.Context, scope rolloutScope) ([]rolloutCluster, error) {
	nodes, err := e.nodeMarks(ctx)
	if err != nil {
		return nil, err
	}
	var out []rolloutCluster
	for _, ns := range scope.namespaces() {
		want := scope[ns]
		machines, err := listLCM[lcmv1.LCMMachine](ctx, e.client, lcmMachineGVK, ns)
		if err != nil {
			return nil, err
		}
		clusters, err := listLCM[lcmv1.LCMCluster](ctx, e.client, lcmClusterGVK, ns)
		if err != nil {
			return nil, err
		}
		byName := map[string]*rolloutCluster{}
		at := func(name string) *rolloutCluster {
			if byName[name] == nil {
				byName[name] = &rolloutCluster{Namespace: ns, Name: name}
			}
			return byName[name]
		}
		for name := range want.clusters {
			at(name)
		}
		for i := range clusters {
			if c := byName[clusters[i].Name]; c != nil {
				c.Cluster = &clusters[i]
			}
		}
		for i := range machines {
			m := &machines[i]
			if !want.machines[m.Name] || m.Spec.ClusterName == "" {
				continue
			}
			c := at(m.Spec.ClusterName)
			if c.Cluster == nil {
				c.Cluster = findCluster(clusters, m.Spec.ClusterName)
			}
			rm := rolloutMachine{LCMMachine: m}
			if annotations, found := nodes[m.Status.Hostname]; found && m.Status.Hostname != "" {
				rm.NodeFound, rm.DrainMark = true, annotations[drainMarkKey]
			}
			c.Machines = append(c.Machines, rm)
		}
		for _, name := range slices.Sorted(maps.Keys(byName)) {
			c := byName[name]
			sort.Slice(c.Machines, func(i, j int) bool { return c.Machines[i].Name < c.Machines[j].Name })
			out = append(out, *c)
		}
	}
	return out, nil
}

func findCluster(clusters []lcmv1.LCMCluster, name string) *lcmv1.LCMCluster {
	for i := range clusters {
		if clusters[i].Name == name {
			return &clusters[i]
		}
	}
	return nil
}

// nodeMarks lists the Nodes, metadata only, and returns their annotations
// by name: enough to know which exist and which the rollout cordoned.
func (e *Executor) nodeMarks(ctx context.Context) (map[string]map[string]string, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(nodeListGVK)
	if err := e.client.List(ctx, list); err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	out := make(map[string]map[string]string, len(list.Items))
	for _, n := range list.Items {
		out[n.Name] = n.Annotations
	}
	return out, nil
}

// listLCM lists LCM objects of one kind in a namespace, read as
// unstructured so that the client's scheme needs no LCM types, and
// decodes them.
func listLCM[T any](ctx context.Context, c client.Client, gvk schema.GroupVersionKind, ns string) ([]T, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
		err = fmt.Errorf("list %s in %s: %w", gvk.Kind, ns, err)
		if meta.IsNoMatchError(err) {
			return nil, Stalled(fmt.Errorf("%w (are the LCM CustomResourceDefinitions installed?)", err))
		}
		return nil, err
	}
	out := make([]T, len(list.Items))
	for i := range list.Items {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, &out[i]); err != nil {
			return nil, fmt.Errorf("decode %s: %w", ObjectRef(&list.Items[i]), err)
		}
	}
	return out, nil
}

package pivot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Labels Capstan's executor puts on every object it applies.
const (
	appliedByName      = "capstan.dev/name"
	appliedByNamespace = "capstan.dev/namespace"
)

// builtInGroups are served by kube-apiserver itself. Of their kinds only
// Secrets and ConfigMaps move: the rest belongs to the cluster, not to the
// deployment (Pods, Events, Leases, ...).
var builtInGroups = map[string]bool{
	"": true, "apps": true, "batch": true, "policy": true, "autoscaling": true, "coordination.k8s.io": true,
	"discovery.k8s.io": true, "events.k8s.io": true, "networking.k8s.io": true, "node.k8s.io": true,
	"rbac.authorization.k8s.io": true, "scheduling.k8s.io": true, "storage.k8s.io": true,
	"admissionregistration.k8s.io": true, "apiextensions.k8s.io": true, "apiregistration.k8s.io": true,
	"authentication.k8s.io": true, "authorization.k8s.io": true, "certificates.k8s.io": true,
	"flowcontrol.apiserver.k8s.io": true, "internal.apiserver.k8s.io": true, "resource.k8s.io": true,
	"storagemigration.k8s.io": true,
}

// movableKinds are the namespaced kinds a cluster serves that can move:
// Secrets, ConfigMaps and every custom resource that can be listed, in
// their preferred versions.
func movableKinds(d discovery.DiscoveryInterface) ([]schema.GroupVersionKind, error) {
	lists, err := d.ServerPreferredNamespacedResources()
	if err != nil && len(lists) == 0 {
		return nil, fmt.Errorf("discover the kinds the cluster serves: %w", err)
	}
	var kinds []schema.GroupVersionKind
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") {
				continue
			}
			if builtInGroups[gv.Group] && !(gv.Group == "" && (r.Kind == "Secret" || r.Kind == "ConfigMap")) {
				continue
			}
			kinds = append(kinds, gv.WithKind(r.Kind))
		}
	}
	return kinds, nil
}

// listConcurrency is how many kinds are listed at once: an API server
// answers the first request for each custom resource kind slowly (about
// a second on a fresh one), and a Metal3 cluster has forty kinds.
const listConcurrency = 8

// listKinds lists every kind of kinds with opts, at most listConcurrency
// at once, and returns the lists in the order of kinds.
func listKinds(ctx context.Context, c client.Client, kinds []schema.GroupVersionKind, opts ...client.ListOption) ([]*unstructured.UnstructuredList, error) {
	lists := make([]*unstructured.UnstructuredList, len(kinds))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(listConcurrency)
	for i, gvk := range kinds {
		g.Go(func() error {
			list := &unstructured.UnstructuredList{}
			list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
			if err := c.List(ctx, list, opts...); err != nil {
				return fmt.Errorf("list %s: %w", gvk.Kind, err)
			}
			lists[i] = list
			return nil
		})
	}
	return lists, g.Wait()
}

// List returns every movable object of the namespaces: what BuildGraph
// chooses from.
func List(ctx context.Context, c client.Client, d discovery.DiscoveryInterface, namespaces []string) ([]*unstructured.Unstructured, error) {
	kinds, err := movableKinds(d)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	var errs []error
	for _, ns := range namespaces {
		lists, err := listKinds(ctx, c, kinds, client.InNamespace(ns))
		if err != nil {
			errs = append(errs, fmt.Errorf("in %s: %w", ns, err))
			continue
		}
		for _, list := range lists {
			for i := range list.Items {
				out = append(out, &list.Items[i])
			}
		}
	}
	return out, errors.Join(errs...)
}

// Discover lists what a move of the deployment namespace/name chooses
// from: every movable object of the namespaces that hold the deployment
// or an object it applied, and the deployment's own objects among them.
func Discover(ctx context.Context, c client.Client, d discovery.DiscoveryInterface, namespace, name string) (all []*unstructured.Unstructured, roots []Object, err error) {
	kinds, err := movableKinds(d)
	if err != nil {
		return nil, nil, err
	}
	namespaces := []string{namespace}
	selector := client.MatchingLabels{appliedByName: name, appliedByNamespace: namespace}
	lists, err := listKinds(ctx, c, kinds, selector)
	if err != nil {
		return nil, nil, fmt.Errorf("list the objects of ClusterDeployment %s/%s: %w", namespace, name, err)
	}
	for _, list := range lists {
		for _, u := range list.Items {
			if !slices.Contains(namespaces, u.GetNamespace()) {
				namespaces = append(namespaces, u.GetNamespace())
			}
		}
	}
	if all, err = List(ctx, c, d, namespaces); err != nil {
		return nil, nil, err
	}
	return all, DeploymentRoots(all, namespace, name), nil
}

// DeploymentRoots are the objects the deployment namespace/name applied
// (Capstan's executor labels each with the deployment), and the
// deployment itself, among all.
func DeploymentRoots(all []*unstructured.Unstructured, namespace, name string) []Object {
	var roots []Object
	for _, u := range all {
		l := u.GetLabels()
		self := u.GetKind() == "ClusterDeployment" && u.GetNamespace() == namespace && u.GetName() == name
		if self || (l[appliedByName] == name && l[appliedByNamespace] == namespace) {
			roots = append(roots, ObjectOf(u))
		}
	}
	return roots
}

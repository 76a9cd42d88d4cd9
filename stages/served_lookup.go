package stages

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/stages/preflight"
)

// crdGVK is how LookupServed reads a kind's CustomResourceDefinition.
var crdGVK = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}

// LookupServed asks a cluster which versions serve the kinds of objects:
// the RESTMapper (discovery) says which versions are served, and the
// kind's CustomResourceDefinition, where there is one and it may be read,
// which of them are deprecated. A CRD that cannot be read (Capstan's
// ServiceAccount needs get on customresourcedefinitions for it) only
// costs the deprecation warnings. An error means the cluster could not
// be asked; retrying may help.
func LookupServed(ctx context.Context, crds client.Reader, mapper meta.RESTMapper, objects []*unstructured.Unstructured) (ServedAPIs, error) {
	served := ServedAPIs{Kinds: map[schema.GroupKind][]ServedVersion{}}
	asked := map[schema.GroupVersionKind]bool{}
	for _, obj := range objects {
		if obj == nil || obj.Object == nil {
			continue
		}
		gvk := obj.GroupVersionKind()
		if asked[gvk] {
			continue
		}
		asked[gvk] = true
		// Ask for the object's own version first: a cached mapper reloads
		// a version it does not know yet, which RESTMappings would not.
		if _, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil && !meta.IsNoMatchError(err) {
			return served, fmt.Errorf("look up %s: %w", gvk.GroupVersion().WithKind(gvk.Kind), err)
		}
	}
	for gvk := range asked {
		gk := gvk.GroupKind()
		if _, done := served.Kinds[gk]; done {
			continue
		}
		versions, err := lookupKind(ctx, crds, mapper, gk)
		if err != nil {
			return served, err
		}
		if len(versions) > 0 {
			served.Kinds[gk] = versions
		}
	}
	return served, nil
}

// lookupKind returns the versions that serve one kind, preferred first.
func lookupKind(ctx context.Context, crds client.Reader, mapper meta.RESTMapper, gk schema.GroupKind) ([]ServedVersion, error) {
	mappings, err := mapper.RESTMappings(gk)
	if meta.IsNoMatchError(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up the versions of %s: %w", gk, err)
	}
	var versions []ServedVersion
	for _, m := range mappings {
		v := m.GroupVersionKind.Version
		if !slices.ContainsFunc(versions, func(s ServedVersion) bool { return s.Version == v }) {
			versions = append(versions, ServedVersion{Version: v})
		}
	}
	if len(mappings) == 0 || builtInGroup(gk.Group) || crds == nil {
		return sortVersions(versions), nil
	}
	// The CRD is named after the resource; it is the fresher witness of
	// what is served, and the only one of what is deprecated.
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(crdGVK)
	name := mappings[0].Resource.Resource + "." + gk.Group
	switch err := crds.Get(ctx, client.ObjectKey{Name: name}, crd); {
	case apierrors.IsNotFound(err), apierrors.IsForbidden(err), meta.IsNoMatchError(err):
		// Served by an aggregated API server, or not ours to read.
		return sortVersions(versions), nil
	case err != nil:
		return nil, fmt.Errorf("look up CustomResourceDefinition %s: %w", name, err)
	}
	if defined, fromCRD, ok := crdServes(crd); ok && defined == gk {
		return fromCRD, nil
	}
	return sortVersions(versions), nil
}

// checkServed looks every object up in the executor's cluster and judges
// it with CheckServed. An executor without a client checks nothing: it
// has no cluster to ask.
func (e *Executor) checkServed(ctx context.Context, objects []*unstructured.Unstructured) ([]preflight.Problem, error) {
	if e.client == nil {
		return nil, nil
	}
	served, err := LookupServed(ctx, e.client, e.client.RESTMapper(), objects)
	if err != nil {
		return nil, err
	}
	return CheckServed(objects, served), nil
}

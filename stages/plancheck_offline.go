package stages

import (
	"context"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/capstan-dev/capstan/stages/preflight"
	objectschema "github.com/capstan-dev/capstan/stages/schema"
)

// OfflineAPIs is what a cluster would serve that runs Kubernetes' built-in
// APIs (those client-go knows) and has the given CustomResourceDefinitions
// installed: the served-API check of `capstan validate` without a cluster.
type OfflineAPIs struct {
	served ServedAPIs
	groups map[string]bool
	crds   []*unstructured.Unstructured
}

// NewOfflineAPIs reads the kinds and versions crds define, beside the
// built-in ones.
func NewOfflineAPIs(crds []*unstructured.Unstructured) OfflineAPIs {
	o := OfflineAPIs{served: ServedAPIs{Kinds: map[schema.GroupKind][]ServedVersion{}}, groups: map[string]bool{}}
	for gvk := range scheme.Scheme.AllKnownTypes() {
		if gvk.Version == "__internal" || gvk.Kind == "WatchEvent" || gvk.Kind == "" {
			continue
		}
		gk := gvk.GroupKind()
		o.groups[gk.Group] = true
		if !servesVersion(o.served, gvk) {
			o.served.Kinds[gk] = sortVersions(append(o.served.Kinds[gk], ServedVersion{Version: gvk.Version}))
		}
	}
	for _, crd := range crds {
		if gk, versions, ok := crdServes(crd); ok {
			o.served.Kinds[gk] = versions
			o.groups[gk.Group] = true
			o.crds = append(o.crds, crd)
		}
	}
	return o
}

// CheckOffline runs the preflight checks that need no cluster over a
// plan: CheckPlan, CheckServed against the offline APIs for the objects
// of groups they know, and the schema check of each object of a served
// kind and version against its CRD's schema (a CRD the plan applies
// replaces one given to NewOfflineAPIs from that object on) or, for a
// built-in kind, Kubernetes' OpenAPI document of the pinned version
// (schema.Kubernetes). An object of a group neither Kubernetes nor the
// CRDs define is not judged (it may be a provider's the CRDs do not
// cover); skipped counts those. The error is the embedded documents not
// reading, a bug.
func (o OfflineAPIs) CheckOffline(ctx context.Context, plan *Plan, opts PreflightOptions) (report preflight.Report, skipped int, err error) {
	report.Problems = CheckPlan(plan)
	objects, _ := appliedWithStage(plan)
	var known []*unstructured.Unstructured
	for _, obj := range objects {
		group := obj.GroupVersionKind().Group
		if o.groups[group] || planDefinesGroup(objects, group) {
			known = append(known, obj)
		} else {
			skipped++
		}
	}
	served := checkServed(known, o.served, opts.fileOf)
	report.Problems = append(report.Problems, served...)
	report.Problems = append(report.Problems, checkReadVersions(plan, objects, o.served)...)
	refused := map[string]bool{}
	for _, p := range served {
		if !p.Warning {
			refused[p.Object] = true
		}
	}
	check := map[*unstructured.Unstructured]bool{}
	for _, obj := range known {
		check[obj] = !refused[problemRef(obj)]
	}
	v := objectschema.New(objectschema.Kubernetes())
	for _, crd := range o.crds {
		// One the API server would refuse cannot be installed: its kinds
		// are not checked.
		_ = v.AddCRD(crd)
	}
	found, err := checkSchemas(ctx, v, objects, check, opts)
	report.Problems = append(report.Problems, found...)
	return report, skipped, err
}

// planDefinesGroup reports whether a CRD among objects defines a kind of
// group.
func planDefinesGroup(objects []*unstructured.Unstructured, group string) bool {
	for _, obj := range objects {
		if gk, _, ok := crdServes(obj); ok && gk.Group == group {
			return true
		}
	}
	return false
}

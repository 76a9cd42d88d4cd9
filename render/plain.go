package render

import (
	"path"
	"sort"
	"strings"

	"sigs.k8s.io/kustomize/api/provider"
	"sigs.k8s.io/kustomize/api/resource"
	"sigs.k8s.io/kustomize/kyaml/resid"
)

// A plain kustomization lists files of objects under `resources:` and
// nothing else: no transformer, generator, patch, component, base or sort
// option. kustomize builds it in time quadratic in its objects (each
// object appended to its resource map is compared with all the others,
// four times over; kubernetes-sigs/kustomize#5084): 0.6 - 1.6 s for 1,000
// ConfigMaps on this project's machine. buildPlain builds it the way
// kustomize does, with kustomize's own parser and resource type, and only
// the duplicate check and the ordering done with a map and one sort:
//
//   - each file is read and parsed by kustomize's resource factory
//     (multi-document YAML, `List` kinds inlined, empty documents dropped);
//   - each object gets kustomize's origin annotation for its file;
//   - objects kustomize ignores (config.kubernetes.io/local-config: "true")
//     are dropped;
//   - the objects are ordered in kustomize's legacy order (its default when
//     the kustomization sets no sortOptions), and kustomize's build
//     annotations are removed.
//
// Whenever it meets something it does not handle the same way (a
// duplicate object, an entry that is not a file in the overlay, a parse
// error), it gives up and kustomize builds the overlay, so that errors
// read as kustomize words them. TestPlainBuildMatchesKustomize holds the
// two to the same output.

// plainFields are the fields a plain kustomization may set.
var plainFields = map[string]bool{"apiVersion": true, "kind": true, "resources": true, "buildMetadata": true}

// isPlain reports whether a kustomization (its raw fields) is plain:
// only files under resources, and buildMetadata asking for nothing but
// origin annotations (which Build asks for itself).
func isPlain(raw map[string]any) bool {
	for field := range raw {
		if !plainFields[field] {
			return false
		}
	}
	if kind, ok := raw["kind"]; ok && kind != "Kustomization" {
		return false
	}
	if v, ok := raw["apiVersion"]; ok && v != "kustomize.config.k8s.io/v1beta1" {
		return false
	}
	if meta, ok := raw["buildMetadata"]; ok {
		list, ok := meta.([]any)
		if !ok {
			return false
		}
		for _, m := range list {
			if m != "originAnnotations" {
				return false
			}
		}
	}
	resources, ok := raw["resources"].([]any)
	if !ok || len(resources) == 0 {
		return false
	}
	for _, r := range resources {
		s, ok := r.(string)
		if !ok || s == "" || strings.Contains(s, "://") || path.IsAbs(s) || strings.HasPrefix(path.Clean(s), "..") || path.Clean(s) == "." {
			return false
		}
	}
	return true
}

// plainResources returns the entries of a plain kustomization's
// resources (isPlain), cleaned as kustomize cleans them ("./a.yaml" is
// "a.yaml").
func plainResources(raw map[string]any) []string {
	var out []string
	for _, r := range raw["resources"].([]any) {
		out = append(out, path.Clean(r.(string)))
	}
	return out
}

// plainID is what kustomize compares to tell two objects apart
// (resid.ResId.Equals): group, version, kind, name and the effective
// namespace.
type plainID struct {
	gvk       resid.Gvk
	name      string
	namespace string
}

// buildPlain builds the plain kustomization in root whose resources are
// entries, reading files of a. It returns false when kustomize must build
// it instead (see above).
func buildPlain(a *artifact, root string, entries []string) (_ []*resource.Resource, ok bool) {
	// kyaml reads the process-wide OpenAPI schema (is a kind namespaced?)
	// that a kustomize run may replace meanwhile.
	kustomizeMu.Lock()
	defer kustomizeMu.Unlock()
	defer func() {
		if recover() != nil {
			ok = false // kustomize builds it, and reports what broke
		}
	}()
	rf := provider.NewDefaultDepProvider().GetResourceFactory()
	var all []*resource.Resource
	seen := map[plainID]bool{}
	for _, entry := range entries {
		file := path.Join(root, entry)
		if !a.isFile(file) {
			return nil, false
		}
		data, err := a.fs.ReadFile("/" + file)
		if err != nil {
			return nil, false
		}
		resources, err := rf.SliceFromBytes(data)
		if err != nil {
			return nil, false
		}
		origin, err := (&resource.Origin{Path: entry}).String()
		if err != nil {
			return nil, false
		}
		for _, res := range resources {
			if _, err := res.GetValidatedMetadata(); err != nil {
				return nil, false
			}
			id := res.CurId()
			key := plainID{gvk: resid.Gvk{Group: id.Group, Version: id.Version, Kind: id.Kind}, name: id.Name, namespace: id.EffectiveNamespace()}
			if seen[key] {
				return nil, false
			}
			seen[key] = true
			annotations := res.GetAnnotations()
			if annotations == nil {
				annotations = map[string]string{}
			}
			annotations[originAnnotationKey] = origin
			if err := res.SetAnnotations(annotations); err != nil {
				return nil, false
			}
			all = append(all, res)
		}
	}
	kept := all[:0]
	for _, res := range all {
		local, ok := res.GetAnnotations()[localConfigAnnotation]
		if !ok || local == "false" {
			kept = append(kept, res)
		}
	}
	legacySort(kept)
	for _, res := range kept {
		res.RemoveBuildAnnotations()
	}
	return kept, true
}

// originAnnotationKey and localConfigAnnotation are kustomize's
// (api/internal/utils.OriginAnnotationKey, api/konfig.IgnoredByKustomizeAnnotation).
const (
	originAnnotationKey   = "config.kubernetes.io/origin"
	localConfigAnnotation = "config.kubernetes.io/local-config"
)

// legacySort orders resources as kustomize's legacy sort order does
// (api/internal/builtins/SortOrderTransformer.go, which kustomize does not
// export): kinds in orderFirst first, in that order, those in orderLast
// last, and within a rank by group, version and kind, then by namespace
// and name.
func legacySort(resources []*resource.Resource) {
	ids := make([]resid.ResId, len(resources))
	for i, res := range resources {
		ids[i] = res.CurId()
	}
	sort.Sort(legacySorter{ids: ids, resources: resources})
}

var legacyTypeOrders = func() map[string]int {
	first := []string{"Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition",
		"ServiceAccount", "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding",
		"ClusterRoleBinding", "ConfigMap", "Secret", "Endpoints", "Service", "LimitRange",
		"PriorityClass", "PersistentVolume", "PersistentVolumeClaim", "Deployment",
		"StatefulSet", "CronJob", "PodDisruptionBudget"}
	last := []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
	m := map[string]int{}
	for i, n := range first {
		m[n] = -len(first) + i
	}
	for i, n := range last {
		m[n] = 1 + i
	}
	return m
}()

type legacySorter struct {
	ids       []resid.ResId
	resources []*resource.Resource
}

func (s legacySorter) Len() int { return len(s.ids) }

func (s legacySorter) Swap(i, j int) {
	s.ids[i], s.ids[j] = s.ids[j], s.ids[i]
	s.resources[i], s.resources[j] = s.resources[j], s.resources[i]
}

func (s legacySorter) Less(i, j int) bool {
	a, b := s.ids[i], s.ids[j]
	if !a.Gvk.Equals(b.Gvk) {
		ra, rb := legacyTypeOrders[a.Kind], legacyTypeOrders[b.Kind]
		if ra != rb {
			return ra < rb
		}
		if a.Kind == "Namespace" && b.Kind == "Namespace" && (a.Group == "" || b.Group == "") {
			return legacyGVKString(a.Gvk) > legacyGVKString(b.Gvk)
		}
		return legacyGVKString(a.Gvk) < legacyGVKString(b.Gvk)
	}
	return legacyIDString(a) < legacyIDString(b)
}

func legacyGVKString(x resid.Gvk) string {
	return orDefault(x.Group, "~G") + "_" + orDefault(x.Version, "~V") + "_" + orDefault(x.Kind, "~K")
}

func legacyIDString(id resid.ResId) string {
	return id.Gvk.String() + "|" + orDefault(id.Namespace, "~X") + "|" + orDefault(id.Name, "~N")
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

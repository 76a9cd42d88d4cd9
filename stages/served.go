package stages

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// ServedVersion is one version in which a cluster serves a kind.
type ServedVersion struct {
	// Version is the version alone, like v1beta2.
	Version string
	// Deprecated is set when the kind's CustomResourceDefinition marks
	// the version deprecated: the API server still serves it, with a
	// warning, until a provider upgrade drops it.
	Deprecated bool
	// Warning is the CRD's deprecationWarning, when it sets one.
	Warning string
}

// ServedAPIs is what a cluster serves for the kinds of a plan, as
// LookupServed reads it from discovery. It holds only the kinds asked
// about; a kind without an entry is served in no version.
type ServedAPIs struct {
	// Kinds maps a group and kind to the versions that serve it,
	// preferred first.
	Kinds map[schema.GroupKind][]ServedVersion
}

// servedKind is what CheckServed knows of one kind: the cluster's
// versions, or those of a CustomResourceDefinition earlier in the plan,
// which will replace the cluster's once it is applied.
type servedKind struct {
	versions  []ServedVersion
	definedBy string // the CRD of the plan that defines the kind, if one does
}

// CheckServed is the judgement of the served-API preflight check: for
// each object, in the order the plan applies them, whether the cluster
// will serve its apiVersion and kind when its stage applies it. It
// returns every problem at once, in object order:
//
//   - a kind no API of the cluster serves is an error (field kind): its
//     provider, the CRD that defines it, is not installed;
//   - a kind the cluster serves, but not in the object's version, is an
//     error (field apiVersion) that names the versions it is served in;
//   - a version the CRD marks deprecated is a warning that names the
//     version to use instead.
//
// A CustomResourceDefinition among the objects defines its kind, in the
// versions it serves, for the objects after it: once applied, it will be
// served, whatever the cluster serves now. Objects carry the file they
// came from when render kept kustomize's origin annotation; problems
// then name it.
func CheckServed(objects []*unstructured.Unstructured, served ServedAPIs) []preflight.Problem {
	return checkServed(objects, served, originFile)
}

// checkServed is CheckServed with the file of each object from fileOf.
func checkServed(objects []*unstructured.Unstructured, served ServedAPIs, fileOf func(*unstructured.Unstructured) string) []preflight.Problem {
	kinds := make(map[schema.GroupKind]servedKind, len(served.Kinds))
	for gk, versions := range served.Kinds {
		kinds[gk] = servedKind{versions: versions}
	}
	var problems []preflight.Problem
	for _, obj := range objects {
		if obj == nil || obj.Object == nil {
			continue
		}
		if p, found := judgeServed(obj, kinds[obj.GroupVersionKind().GroupKind()], fileOf(obj)); found {
			problems = append(problems, p)
		}
		if gk, versions, ok := crdServes(obj); ok {
			kinds[gk] = servedKind{versions: versions, definedBy: "CustomResourceDefinition " + obj.GetName() + " of this plan"}
		}
	}
	return problems
}

// judgeServed returns the problem with one object's apiVersion and kind,
// if it has one.
func judgeServed(obj *unstructured.Unstructured, kind servedKind, file string) (preflight.Problem, bool) {
	gvk := obj.GroupVersionKind()
	p := preflight.Problem{Object: problemRef(obj), Field: "apiVersion"}
	i := slices.IndexFunc(kind.versions, func(v ServedVersion) bool { return v.Version == gvk.Version })
	use := recommended(kind.versions)
	switch {
	case len(kind.versions) == 0 && builtInGroup(gvk.Group):
		p.Field = "kind"
		p.Message = fmt.Sprintf("the cluster serves no %s in %s; check the kind's spelling and apiVersion", gvk.Kind, groupName(gvk.Group))
	case len(kind.versions) == 0:
		p.Field = "kind"
		p.Message = fmt.Sprintf("the cluster serves no %s in %s: no CustomResourceDefinition in the cluster or earlier in this plan defines it; install the provider first",
			gvk.Kind, groupName(gvk.Group))
	case i < 0:
		p.Message = fmt.Sprintf("%s is served as %s; not %s", gvk.Kind, versionList(gvk.Group, kind.versions), gvk.Version)
		if kind.definedBy != "" {
			p.Message += " (as the " + kind.definedBy + " defines it)"
		}
		if use != "" {
			p.Message += "; write the object in " + groupVersion(gvk.Group, use)
		}
	case kind.versions[i].Deprecated:
		p.Warning = true
		p.Message = fmt.Sprintf("%s is deprecated", obj.GetAPIVersion())
		if w := kind.versions[i].Warning; w != "" {
			p.Message += " (" + w + ")"
		}
		if use != "" {
			p.Message += "; write the object in " + groupVersion(gvk.Group, use)
		} else {
			p.Message += "; no version of " + gvk.Kind + " that is not deprecated is served"
		}
	default:
		return p, false
	}
	p.Message += inFile(file)
	return p, true
}

// recommended returns the version to write a kind in: the preferred of
// those that are not deprecated.
func recommended(versions []ServedVersion) string {
	for _, v := range versions {
		if !v.Deprecated {
			return v.Version
		}
	}
	return ""
}

// versionList names the served versions as "group/v1beta2, v1beta1".
func versionList(group string, versions []ServedVersion) string {
	names := make([]string, len(versions))
	for i, v := range versions {
		names[i] = v.Version
	}
	names[0] = groupVersion(group, names[0])
	return strings.Join(names, ", ")
}

func groupVersion(group, version string) string {
	return schema.GroupVersion{Group: group, Version: version}.String()
}

func groupName(group string) string {
	if group == "" {
		return "the core API group"
	}
	return "group " + group
}

// builtInGroup reports whether a group can only be one the API server
// serves itself: a CustomResourceDefinition's group holds a dot.
func builtInGroup(group string) bool {
	return !strings.Contains(group, ".")
}

// crdServes reads the kind a CustomResourceDefinition defines and the
// versions it serves, preferred first.
func crdServes(obj *unstructured.Unstructured) (schema.GroupKind, []ServedVersion, bool) {
	if !isCRD(obj) {
		return schema.GroupKind{}, nil, false
	}
	group, _, _ := unstructured.NestedString(obj.Object, "spec", "group")
	kind, _, _ := unstructured.NestedString(obj.Object, "spec", "names", "kind")
	list, _, _ := unstructured.NestedSlice(obj.Object, "spec", "versions")
	if group == "" || kind == "" {
		return schema.GroupKind{}, nil, false
	}
	var versions []ServedVersion
	for _, item := range list {
		v, _ := item.(map[string]any)
		name, _ := v["name"].(string)
		if served, _ := v["served"].(bool); !served || name == "" {
			continue
		}
		deprecated, _ := v["deprecated"].(bool)
		warning, _ := v["deprecationWarning"].(string)
		versions = append(versions, ServedVersion{Version: name, Deprecated: deprecated, Warning: warning})
	}
	return schema.GroupKind{Group: group, Kind: kind}, sortVersions(versions), true
}

// sortVersions orders versions as discovery does, preferred first: GA
// before beta before alpha, higher before lower.
func sortVersions(versions []ServedVersion) []ServedVersion {
	slices.SortStableFunc(versions, func(a, b ServedVersion) int {
		return -version.CompareKubeAwareVersionStrings(a.Version, b.Version)
	})
	return versions
}

// originAnnotation is where kustomize records the file an object came
// from; render keeps it when the overlay asks for it (buildMetadata:
// [originAnnotations]).
const originAnnotation = "config.kubernetes.io/origin"

// originFile returns the file an object came from, or "".
func originFile(obj *unstructured.Unstructured) string {
	raw := obj.GetAnnotations()[originAnnotation]
	if raw == "" {
		return ""
	}
	var origin struct {
		Path         string `json:"path"`
		ConfiguredIn string `json:"configuredIn"`
	}
	if err := yaml.Unmarshal([]byte(raw), &origin); err != nil {
		return ""
	}
	if origin.Path != "" {
		return origin.Path
	}
	return origin.ConfiguredIn
}

// inFile is the suffix that names the file a problem is in, or "".
func inFile(file string) string {
	if file == "" {
		return ""
	}
	return " (in " + file + ")"
}

// problemRef names an object the way preflight problems do: `Kind
// namespace/name`.
func problemRef(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return obj.GetKind() + " " + ns + "/" + obj.GetName()
	}
	return obj.GetKind() + " " + obj.GetName()
}

// AppliedObjects returns every object the plan applies, in the order it
// applies them: stage after stage, and within a stage Namespaces and
// CustomResourceDefinitions first, as Apply does. Objects that only wait,
// validate, roll out, scale or delete stages select are left out, but
// those an apply stage applies are there.
func (p *Plan) AppliedObjects() []*unstructured.Unstructured {
	var objects []*unstructured.Unstructured
	for _, stage := range p.Stages {
		if stage.Action != capstanv1.StageActionApply && stage.Action != "" {
			continue
		}
		first, rest := splitDefinitions(stage.Objects)
		objects = append(append(objects, first...), rest...)
	}
	return objects
}

// servedScope returns the objects a validate stage looks up in the
// cluster: every object of its plan, not only those its select matches,
// so that a kind a later stage applies is caught before the first stage
// changes the cluster. A stage built without a plan looks up its own.
func servedScope(stage *Stage) []*unstructured.Unstructured {
	if stage.PlanObjects != nil {
		return stage.PlanObjects
	}
	return stage.Objects
}

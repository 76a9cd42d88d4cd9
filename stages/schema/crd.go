package schema

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// crdVersion is the schema of one served version of a CRD, ready to
// check objects with.
type crdVersion struct {
	structural *structuralschema.Structural
	validator  apiservervalidation.SchemaValidator
	cel        *cel.Validator
	// preserve marks a schema that keeps unknown fields at its root
	// (x-kubernetes-preserve-unknown-fields): nothing is pruned.
	preserve bool
	// typed is server-side apply's parser of the CRD's kinds, built from
	// the OpenAPI document the API server publishes for the CRD: it finds
	// the wrong types the OpenAPI validator lets through (a list where a
	// string goes).
	typed managedfields.TypeConverter
}

// AddCRD takes the served versions of a CustomResourceDefinition
// (apiextensions.k8s.io/v1, as YAML decodes it) as the schemas of their
// kind, replacing those of an earlier CRD of the same kind: the CRD a
// plan applies replaces the one the cluster has. A version without a
// schema is not checked.
func (v *Validator) AddCRD(obj *unstructured.Unstructured) error {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &crd); err != nil {
		return fmt.Errorf("read CustomResourceDefinition %s: %w", obj.GetName(), err)
	}
	versions := map[k8sschema.GroupVersionKind]*crdVersion{}
	tc, err := typeConverter(&crd)
	if err != nil {
		return fmt.Errorf("read the schema of CustomResourceDefinition %s: %w", obj.GetName(), err)
	}
	for _, ver := range crd.Spec.Versions {
		gvk := k8sschema.GroupVersionKind{Group: crd.Spec.Group, Version: ver.Name, Kind: crd.Spec.Names.Kind}
		if !ver.Served || ver.Schema == nil || ver.Schema.OpenAPIV3Schema == nil {
			continue
		}
		cv, err := newCRDVersion(ver.Schema.OpenAPIV3Schema)
		if err != nil {
			return fmt.Errorf("read the schema of CustomResourceDefinition %s version %s: %w", obj.GetName(), ver.Name, err)
		}
		cv.typed = tc
		versions[gvk] = cv
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for gvk := range v.crds {
		if gvk.Group == crd.Spec.Group && gvk.Kind == crd.Spec.Names.Kind {
			delete(v.crds, gvk)
		}
	}
	for gvk, cv := range versions {
		v.crds[gvk] = cv
	}
	return nil
}

// typeConverter builds the parser server-side apply uses for the CRD's
// objects, from the same schemas the API server's CRD handler publishes:
// each served version's structural schema, unfolded, with metadata the
// standard ObjectMeta (taken from the embedded Kubernetes documents) and
// apiVersion and kind strings. The handler's own builder
// (controller/openapi/builder) would do the same but links most of an API
// server into the binary.
func typeConverter(crd *apiextensionsv1.CustomResourceDefinition) (managedfields.TypeConverter, error) {
	meta, err := metaSchemas()
	if err != nil {
		return nil, err
	}
	schemas := map[string]*spec.Schema{}
	for name, s := range meta {
		schemas[name] = s
	}
	for _, ver := range crd.Spec.Versions {
		if !ver.Served || ver.Schema == nil || ver.Schema.OpenAPIV3Schema == nil {
			continue
		}
		var props apiextensions.JSONSchemaProps
		if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(ver.Schema.OpenAPIV3Schema, &props, nil); err != nil {
			return nil, err
		}
		structural, err := structuralschema.NewStructural(&props)
		if err != nil {
			return nil, err
		}
		root := structural.Unfold().ToKubeOpenAPI()
		kubeNative(root)
		root.AddExtension("x-kubernetes-group-version-kind", []any{map[string]any{
			"group": crd.Spec.Group, "version": ver.Name, "kind": crd.Spec.Names.Kind}})
		schemas[fmt.Sprintf("capstan.crd.%s.%s.%s", crd.Spec.Group, ver.Name, crd.Spec.Names.Kind)] = root
	}
	return managedfields.NewTypeConverter(schemas, false)
}

// objectMetaRef names ObjectMeta in the embedded documents.
const objectMetaRef = "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

// kubeNative gives a resource's schema (and those of the resources it
// embeds, x-kubernetes-embedded-resource) the standard metadata and type
// fields, as the API server publishes them.
func kubeNative(s *spec.Schema) {
	s.SetProperty("metadata", *spec.RefSchema(objectMetaRef))
	s.SetProperty("apiVersion", *spec.StringProperty())
	s.SetProperty("kind", *spec.StringProperty())
	var walk func(*spec.Schema)
	walk = func(s *spec.Schema) {
		if s == nil {
			return
		}
		for k, v := range s.Properties {
			walk(&v)
			s.Properties[k] = v
		}
		if s.Items != nil {
			walk(s.Items.Schema)
		}
		if s.AdditionalProperties != nil {
			walk(s.AdditionalProperties.Schema)
		}
		if embedded, _ := s.Extensions.GetBool("x-kubernetes-embedded-resource"); embedded {
			s.SetProperty("metadata", *spec.RefSchema(objectMetaRef))
			s.SetProperty("apiVersion", *spec.StringProperty())
			s.SetProperty("kind", *spec.StringProperty())
		}
	}
	for k, v := range s.Properties {
		walk(&v)
		s.Properties[k] = v
	}
}

// metaSchemas are the schemas of ObjectMeta and the types it refers to,
// from the embedded core/v1 document.
var metaSchemas = sync.OnceValues(func() (map[string]*spec.Schema, error) {
	data, err := Kubernetes().Document(context.Background(), k8sschema.GroupVersion{Version: "v1"})
	if err != nil || data == nil {
		return nil, fmt.Errorf("read ObjectMeta's schema from the embedded core/v1 document: %w", err)
	}
	var doc spec3.OpenAPI
	if err := doc.UnmarshalJSON(data); err != nil {
		return nil, err
	}
	out := map[string]*spec.Schema{}
	for name, s := range doc.Components.Schemas {
		if strings.HasPrefix(name, "io.k8s.apimachinery.") {
			out[name] = s
		}
	}
	return out, nil
})

func newCRDVersion(in *apiextensionsv1.JSONSchemaProps) (*crdVersion, error) {
	var props apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(in, &props, nil); err != nil {
		return nil, err
	}
	structural, err := structuralschema.NewStructural(&props)
	if err != nil {
		return nil, err
	}
	validator, _, err := apiservervalidation.NewSchemaValidator(&props)
	if err != nil {
		return nil, err
	}
	return &crdVersion{
		structural: structural,
		validator:  validator,
		cel:        cel.NewValidator(structural, true, celconfig.PerCallLimit),
		preserve:   structural.XPreserveUnknownFields,
	}, nil
}

// validate checks obj as the API server checks a custom resource it is
// asked to create with strict field validation: unknown fields (what
// pruning would drop), then the schema and the CEL rules on what is left.
func (cv *crdVersion) validate(ctx context.Context, obj *unstructured.Unstructured) []Problem {
	content, err := asServerDecodes(obj.Object)
	if err != nil {
		return []Problem{{Message: err.Error()}}
	}
	var problems, typedFound []Problem
	if cv.typed != nil {
		typedFound = typedProblems(cv.typed, obj)
	}
	if !cv.preserve {
		unknown := pruning.PruneWithOptions(content, cv.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
		for _, path := range unknown {
			problems = append(problems, Problem{Field: path, Message: "field not declared in schema"})
		}
	}
	errs := apiservervalidation.ValidateCustomResource(nil, content, cv.validator)
	if cv.cel != nil {
		celErrs, _ := cv.cel.Validate(ctx, nil, cv.structural, content, nil, celconfig.RuntimeCELCostBudget)
		errs = append(errs, celErrs...)
	}
	for _, e := range errs {
		problems = append(problems, fieldProblem(e))
	}
	// The validator's words first: they name the value found.
	return unique(append(problems, typedFound...))
}

// fieldProblem turns a field.Error (path "<nil>.spec.x", "spec.x" or "")
// into a Problem that says what is wrong without repeating the path.
func fieldProblem(e *field.Error) Problem {
	path := strings.TrimPrefix(strings.TrimPrefix(e.Field, "<nil>"), ".")
	msg := e.Type.String()
	if e.Detail != "" {
		msg = strings.TrimPrefix(e.Detail, e.Field+" in body ")
		if e.Type != field.ErrorTypeInvalid && e.Type != field.ErrorTypeTypeInvalid {
			msg = e.ErrorBody() // names the value: Unsupported value: "quick": supported values: ...
		}
	}
	return Problem{Field: path, Message: msg}
}

// unique keeps the first problem of each field: the parser, pruning and
// the validator may each find the same one.
func unique(problems []Problem) []Problem {
	seen := map[string]bool{}
	out := problems[:0]
	for _, p := range problems {
		if !seen[p.Field] {
			seen[p.Field] = true
			out = append(out, p)
		}
	}
	return out
}

// asServerDecodes copies an object as the API server decodes its JSON:
// whole numbers as int64. YAML decoded through JSON holds float64s, on
// which a CEL rule comparing integers fails with a type error the server
// would not raise.
func asServerDecodes(obj map[string]any) (map[string]any, error) {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := utiljson.Unmarshal(data, &out); err != nil {
		return nil, err
	}
	return out, nil
}

package schema

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/kube-openapi/pkg/spec3"
	"sigs.k8s.io/structured-merge-diff/v6/typed"
)

// Problem is one way an object does not fit its schema.
type Problem struct {
	// Field is the path of the field, without a leading dot
	// (spec.template.spec.image.format); empty for the whole object.
	Field string
	// Message says what is wrong and what the schema expects.
	Message string
}

// Documents gives the OpenAPI v3 document that describes one API group
// version (the body of /openapi/v3/apis/<group>/<version>).
type Documents interface {
	// Document returns the JSON document of gv, or nil with no error when
	// gv is not described.
	Document(ctx context.Context, gv k8sschema.GroupVersion) ([]byte, error)
}

// Validator checks objects against the schemas of CRDs it was given and
// of OpenAPI documents it reads on demand. It is safe for concurrent use.
type Validator struct {
	docs Documents

	mu         sync.Mutex
	converters map[k8sschema.GroupVersion]*converter
	crds       map[k8sschema.GroupVersionKind]*crdVersion
}

// converter is the typed-conversion parser of one group version; nil tc
// means the group version has no document.
type converter struct {
	tc  managedfields.TypeConverter
	err error
}

// New returns a Validator that reads built-in schemas from docs (nil
// reads none).
func New(docs Documents) *Validator {
	return &Validator{docs: docs, converters: map[k8sschema.GroupVersion]*converter{}, crds: map[k8sschema.GroupVersionKind]*crdVersion{}}
}

// ErrUnknownKind is returned by Validate for an object whose kind and
// version no CRD and no document describe.
var ErrUnknownKind = errors.New("no schema describes the kind")

// Validate checks obj against its kind's schema: a CRD's, when one was
// added for its group, version and kind, the OpenAPI document of its
// group version otherwise. It returns the problems, sorted by field, or
// ErrUnknownKind, or an error reading a document.
func (v *Validator) Validate(ctx context.Context, obj *unstructured.Unstructured) ([]Problem, error) {
	gvk := obj.GroupVersionKind()
	v.mu.Lock()
	crd := v.crds[gvk]
	v.mu.Unlock()
	if crd != nil {
		return sorted(crd.validate(ctx, obj)), nil
	}
	tc, err := v.converter(ctx, gvk.GroupVersion())
	if err != nil {
		return nil, err
	}
	if tc == nil {
		return nil, fmt.Errorf("%s: %w", gvk, ErrUnknownKind)
	}
	if _, err := tc.ObjectToTyped(obj); err != nil && strings.Contains(err.Error(), "no corresponding type") {
		return nil, fmt.Errorf("%s: %w", gvk, ErrUnknownKind)
	}
	return sorted(typedProblems(tc, obj)), nil
}

// typedProblems parses obj as server-side apply does, and returns what
// does not fit: unknown fields, wrong types, duplicate list keys.
func typedProblems(tc managedfields.TypeConverter, obj *unstructured.Unstructured) []Problem {
	_, err := tc.ObjectToTyped(obj)
	if err == nil {
		return nil
	}
	var errs typed.ValidationErrors
	if !errors.As(err, &errs) {
		return []Problem{{Message: err.Error()}}
	}
	var problems []Problem
	for _, e := range errs {
		problems = append(problems, Problem{Field: strings.TrimPrefix(e.Path, "."), Message: typedMessage(e.ErrorMessage)})
	}
	return problems
}

// converter returns the typed converter of gv's document, nil when there
// is none. A document that does not parse is an error for every object of
// gv.
func (v *Validator) converter(ctx context.Context, gv k8sschema.GroupVersion) (managedfields.TypeConverter, error) {
	v.mu.Lock()
	c, ok := v.converters[gv]
	v.mu.Unlock()
	if ok {
		return c.tc, c.err
	}
	c = &converter{}
	if v.docs != nil {
		c.tc, c.err = readConverter(ctx, v.docs, gv)
	}
	v.mu.Lock()
	v.converters[gv] = c
	v.mu.Unlock()
	return c.tc, c.err
}

func readConverter(ctx context.Context, docs Documents, gv k8sschema.GroupVersion) (managedfields.TypeConverter, error) {
	data, err := docs.Document(ctx, gv)
	if err != nil || data == nil {
		return nil, err
	}
	var doc spec3.OpenAPI
	if err := doc.UnmarshalJSON(data); err != nil {
		return nil, fmt.Errorf("read the OpenAPI document of %s: %w", gv, err)
	}
	if doc.Components == nil || len(doc.Components.Schemas) == 0 {
		return nil, nil
	}
	tc, err := managedfields.NewTypeConverter(doc.Components.Schemas, false)
	if err != nil {
		return nil, fmt.Errorf("read the OpenAPI document of %s: %w", gv, err)
	}
	return tc, nil
}

// Path is the /openapi/v3 path of gv's document.
func Path(gv k8sschema.GroupVersion) string {
	if gv.Group == "" {
		return "api/" + gv.Version
	}
	return "apis/" + gv.Group + "/" + gv.Version
}

func sorted(problems []Problem) []Problem {
	sort.SliceStable(problems, func(i, j int) bool { return problems[i].Field < problems[j].Field })
	return problems
}

// typedMessage drops the Go syntax structured-merge-diff quotes the value
// found in ("expected string, got &value.valueUnstructured{Value:5}"),
// which says nothing to whoever wrote the YAML.
func typedMessage(msg string) string {
	if expected, got, ok := strings.Cut(msg, ", got "); ok && strings.HasPrefix(expected, "expected ") {
		if strings.HasPrefix(got, "&") {
			return strings.Replace(expected, "any scalar", "a string, number or boolean", 1)
		}
	}
	return msg
}

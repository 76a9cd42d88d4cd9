package render

import (
	"errors"
	"strings"
)

// identity is what makes a Kubernetes document an object.
type identity struct {
	APIVersion, Kind, Namespace, Name string
}

// String names the object the way Error.Object does.
func (id identity) String() string {
	return objectName(id.Kind, id.Namespace, id.Name)
}

// key identifies an object for duplicate detection. Only the API group of
// apiVersion counts: the same object served at two versions is one object.
func (id identity) key() string {
	group, _, found := strings.Cut(id.APIVersion, "/")
	if !found {
		group = ""
	}
	return group + "|" + id.Kind + "|" + id.Namespace + "|" + id.Name
}

var (
	errRequired    = errors.New("required")
	errNotAString  = errors.New("must be a string")
	errNotAnObject = errors.New("document is not a mapping, so not a Kubernetes object")
)

// readIdentity reads the identity of a decoded document without judging it.
func readIdentity(m map[string]interface{}) identity {
	var id identity
	id.APIVersion, _ = m["apiVersion"].(string)
	id.Kind, _ = m["kind"].(string)
	if meta, ok := m["metadata"].(map[string]interface{}); ok {
		id.Name, _ = meta["name"].(string)
		id.Namespace, _ = meta["namespace"].(string)
	}
	return id
}

// checkIdentity reports every reason why doc is not a Kubernetes object with
// apiVersion, kind and metadata.name. If lists is set, a kind ending in
// "List" with items needs no name, since kustomize unpacks it.
func checkIdentity(file string, doc document, lists bool) (identity, []error) {
	m := doc.object()
	if m == nil {
		return identity{}, []error{&Error{File: file, Object: documentName(doc.Index), Err: errNotAnObject}}
	}
	id := readIdentity(m)
	var errs []error
	problem := func(field string, v interface{}) {
		err := errRequired
		if _, isString := v.(string); v != nil && !isString {
			err = errNotAString
		}
		errs = append(errs, &Error{File: file, Object: documentName(doc.Index), Field: field, Err: err})
	}
	if id.APIVersion == "" {
		problem("apiVersion", m["apiVersion"])
	}
	if id.Kind == "" {
		problem("kind", m["kind"])
	}
	_, hasItems := m["items"]
	if id.Name == "" && !(lists && strings.HasSuffix(id.Kind, "List") && hasItems) {
		var name interface{}
		if meta, ok := m["metadata"].(map[string]interface{}); ok {
			name = meta["name"]
		}
		problem("metadata.name", name)
	}
	return id, errs
}

package render

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/capstan-dev/capstan/failure"
)

// Reasons of render failures, in conditions, events and
// docs/troubleshooting.md.
const (
	// ReasonRenderFailed: the revision does not build (YAML, kustomize,
	// substitution).
	ReasonRenderFailed = "RenderFailed"
	// ReasonRenderLimit: the revision builds past a limit of --max-*.
	ReasonRenderLimit = "RenderLimitExceeded"
)

// Error is one problem found while rendering, located as precisely as
// render can: the file in the artifact, the object in it and the field in
// the object. Empty parts are left out of the message, which reads like
// "clusters/mgmt/cluster.yaml: Cluster/mgmt: spec.foo: ...". Build and
// LoadManifests join several of them with errors.Join; use errors.As to get
// at them. Every Error means the input must change before a retry can
// succeed: it is a stalled failure (failure.Classified), with reason
// RenderFailed, or RenderLimitExceeded when it wraps ErrLimit.
type Error struct {
	// File is the path of the file in the artifact, slash-separated and
	// relative to its root.
	File string
	// Object names the object as Kind/name or Kind/namespace/name, or
	// "document N" (1-based) when the document has no usable identity.
	Object string
	// Field is the path of the field in the object or kustomization, e.g.
	// "spec.foo" or "resources[2]".
	Field string
	// Err is the underlying problem.
	Err error
}

// Error implements error.
func (e *Error) Error() string {
	var parts []string
	for _, p := range []string{e.File, e.Object, e.Field} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	if e.Err != nil {
		parts = append(parts, e.Err.Error())
	}
	return strings.Join(parts, ": ")
}

// Unwrap returns the underlying problem.
func (e *Error) Unwrap() error { return e.Err }

// Failure gives e its reason and policy: stalled, since only a new
// revision or spec can change what renders.
func (e *Error) Failure() *failure.Error {
	reason := ReasonRenderFailed
	var de *DecryptError
	var ke *KeyFileError
	switch {
	case errors.As(e.Err, &de):
		reason = de.Reason
	case errors.As(e.Err, &ke):
		reason = ke.Reason
	case errors.Is(e.Err, ErrLimit):
		reason = ReasonRenderLimit
	}
	return &failure.Error{Reason: reason, Policy: failure.PolicyStalled, Err: e}
}

// objectName names an object the way Error.Object does.
func objectName(kind, namespace, name string) string {
	if kind == "" {
		kind = "<no kind>"
	}
	if name == "" {
		name = "<no name>"
	}
	if namespace == "" {
		return kind + "/" + name
	}
	return kind + "/" + namespace + "/" + name
}

// objectNameOf names an unstructured object.
func objectNameOf(obj *unstructured.Unstructured) string {
	return objectName(obj.GetKind(), obj.GetNamespace(), obj.GetName())
}

// documentName names a document that has no usable identity.
func documentName(index int) string {
	return fmt.Sprintf("document %d", index)
}

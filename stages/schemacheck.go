package stages

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/stages/preflight"
	"github.com/capstan-dev/capstan/stages/schema"
)

// checkSchemas checks the objects of check against their kinds' schemas,
// walking objects (every object the plan applies, in order) so that a
// CRD the plan applies replaces the schema v had for its kind from that
// object on, as it would on the cluster. Objects whose kind nothing
// describes are left to the served check; opts.Skip'd ones (an unset
// variable) are not checked.
func checkSchemas(ctx context.Context, v *schema.Validator, objects []*unstructured.Unstructured, check map[*unstructured.Unstructured]bool,
	opts PreflightOptions) ([]preflight.Problem, error) {
	found, err := findSchemaProblems(ctx, v, objects, check, opts.Skip)
	problems := make([]preflight.Problem, len(found))
	for i, f := range found {
		problems[i] = f.problem
		problems[i].Message += inFile(opts.fileOf(f.obj))
	}
	return problems, err
}

// schemaFinding is one problem the schema check found, and the object it
// is of: one of those checked, or a CustomResourceDefinition the API
// server would refuse. Its message names no file: the preflight adds it
// to the message, the diff keeps it apart (ObjectDiff.File) so that
// problems of one cause in several files group as one.
type schemaFinding struct {
	obj     *unstructured.Unstructured
	problem preflight.Problem
}

// findSchemaProblems is checkSchemas, each problem with its object: the
// preflight lists the problems, the diff marks the objects. Objects skip
// reports true for are not checked.
func findSchemaProblems(ctx context.Context, v *schema.Validator, objects []*unstructured.Unstructured, check map[*unstructured.Unstructured]bool,
	skip func(*unstructured.Unstructured) bool) ([]schemaFinding, error) {
	var findings []schemaFinding
	for _, obj := range objects {
		if isCRD(obj) {
			if err := v.AddCRD(obj); err != nil {
				findings = append(findings, schemaFinding{obj: obj, problem: preflight.Problem{Object: problemRef(obj), Field: "spec.versions",
					Message: fmt.Sprintf("the API server would refuse this CustomResourceDefinition: %v; fix its openAPIV3Schema", err)}})
			}
		}
		if !check[obj] || (skip != nil && skip(obj)) {
			continue
		}
		found, err := v.Validate(ctx, obj)
		if errors.Is(err, schema.ErrUnknownKind) {
			continue
		}
		if err != nil {
			return findings, fmt.Errorf("check %s against its schema: %w", problemRef(obj), err)
		}
		for _, p := range found {
			findings = append(findings, schemaFinding{obj: obj, problem: schemaProblem(obj, p)})
		}
	}
	return findings, nil
}

// checkLater checks the objects no dry run can reach where they will
// live (later: an earlier stage creates their namespace or their kind)
// against their schemas, and those the schema check passes whose kind
// the cluster serves already in a stand-in namespace (dryRunElsewhere),
// for what only the API server knows.
func (e *Executor) checkLater(ctx context.Context, objects []*unstructured.Unstructured, later map[*unstructured.Unstructured]bool,
	stageOf map[*unstructured.Unstructured]string, served ServedAPIs, owner Owner, opts PreflightOptions) ([]preflight.Problem, error) {
	v, err := e.clusterValidator(ctx, later)
	if err != nil {
		return nil, err
	}
	found, err := findSchemaProblems(ctx, v, objects, later, opts.Skip)
	if err != nil {
		return nil, err
	}
	var problems []preflight.Problem
	flagged := map[*unstructured.Unstructured]bool{}
	for _, f := range found {
		p := f.problem
		p.Message += inFile(opts.fileOf(f.obj))
		problems = append(problems, p)
		flagged[f.obj] = true
	}
	var elsewhere []*unstructured.Unstructured
	redefined := crdKinds(objects)
	for _, obj := range objects {
		if later[obj] && !flagged[obj] && obj.GetNamespace() != "" && servesVersion(served, obj.GroupVersionKind()) &&
			!redefined[obj.GroupVersionKind().GroupKind()] && (opts.Skip == nil || !opts.Skip(obj)) {
			elsewhere = append(elsewhere, obj)
		}
	}
	refused, err := e.dryRunElsewhere(ctx, elsewhere, func(obj *unstructured.Unstructured) string { return stageOf[obj] }, owner, owner.Namespace)
	if err != nil {
		return problems, err
	}
	for i, err := range refused {
		if err != nil {
			obj := elsewhere[i]
			problems = append(problems, preflight.Problem{Object: problemRef(obj), Field: invalidField(err),
				Message: standInMessage(err, owner.Namespace) + inFile(opts.fileOf(obj))})
		}
	}
	return problems, nil
}

// schemaProblem words what the schema check found as the dry run words
// what the API server answers.
func schemaProblem(obj *unstructured.Unstructured, p schema.Problem) preflight.Problem {
	msg := "does not fit the schema of " + obj.GetAPIVersion() + " " + obj.GetKind() + ": " + p.Message
	switch {
	case p.Message == "field not declared in schema":
		msg = fmt.Sprintf("the schema of %s %s declares no such field; check its spelling and the apiVersion", obj.GetAPIVersion(), obj.GetKind())
	case strings.HasPrefix(p.Message, "Required value"):
		msg = fmt.Sprintf("the schema of %s %s requires this field; set it", obj.GetAPIVersion(), obj.GetKind())
	}
	return preflight.Problem{Object: problemRef(obj), Field: p.Field, Message: "schema check: " + msg}
}

// openAPIer is a cluster connection that can list the OpenAPI documents
// its API server serves (remote clusters).
type openAPIer interface {
	Discovery() discovery.DiscoveryInterface
}

// clusterValidator returns a schema validator for the cluster the
// executor acts on: the OpenAPI v3 documents it serves for built-in kinds
// (the embedded ones of the pinned Kubernetes when its discovery is not
// at hand), and the CRDs it has for the custom kinds among objects.
func (e *Executor) clusterValidator(ctx context.Context, objects map[*unstructured.Unstructured]bool) (*schema.Validator, error) {
	var docs schema.Documents = schema.Kubernetes()
	switch c := e.cluster.(type) {
	case openAPIer:
		if d := c.Discovery(); d != nil {
			docs = schema.Cluster(d.OpenAPIV3())
		}
	default:
		if e.homeDiscovery != nil && (e.cluster == nil || e.cluster.Name() == LocalClusterName) {
			docs = schema.Cluster(e.homeDiscovery.OpenAPIV3())
		}
	}
	v := schema.New(docs)
	seen := map[k8sschema.GroupKind]bool{}
	for obj := range objects {
		gvk := obj.GroupVersionKind()
		if seen[gvk.GroupKind()] || !strings.Contains(gvk.Group, ".") || strings.HasSuffix(gvk.Group, ".k8s.io") {
			continue
		}
		seen[gvk.GroupKind()] = true
		m, err := e.client.RESTMapper().RESTMapping(gvk.GroupKind())
		if err != nil {
			continue // not served: the plan's own CRD, if any, describes it
		}
		crd := &unstructured.Unstructured{}
		crd.SetGroupVersionKind(k8sschema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
		err = e.client.Get(ctx, client.ObjectKey{Name: m.Resource.Resource + "." + gvk.Group}, crd)
		switch {
		case err == nil:
			if err := v.AddCRD(crd); err != nil {
				continue // the cluster's own OpenAPI document still describes the kind
			}
		case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
			// An aggregated API, or CRDs Capstan may not read: the
			// OpenAPI document describes the kind, without its CEL rules.
		default:
			return nil, fmt.Errorf("read CustomResourceDefinition %s.%s: %w", m.Resource.Resource, gvk.Group, err)
		}
	}
	return v, nil
}

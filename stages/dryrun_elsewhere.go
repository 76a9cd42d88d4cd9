package stages

import (
	"context"
	"errors"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A dry run in a stand-in namespace (docs/decisions.md, "Dry runs of
// objects whose namespace the plan creates"): an object whose namespace
// an earlier stage creates cannot be dry-run where it will live, yet
// most of what the API server checks of it does not depend on the
// namespace: the built-in kinds' own validation (a Service's ports, a
// Deployment's selector), a CRD's schema after defaulting and its CEL
// rules. The object is sent as a dry-run create into the deployment's own
// namespace, which exists and which its owner controls, and only the API
// server's own Invalid answer counts: an admission webhook or a
// ValidatingAdmissionPolicy may judge by the namespace (its labels, the
// objects in it), and any other answer (Forbidden, AlreadyExists, a
// webhook that does not answer) says nothing certain about the object.

// dryRunElsewhere dry-runs each object as a create in namespace ns and
// returns, per object, the API server's own refusal of it (an
// apierrors.IsInvalid error) or nil. The error is for a cluster that
// stopped answering (IsUnanswered).
func (e *Executor) dryRunElsewhere(ctx context.Context, objects []*unstructured.Unstructured, stageOf func(*unstructured.Unstructured) string,
	owner Owner, ns string) ([]error, error) {
	refused := make([]error, len(objects))
	if ns == "" || (e.cluster != nil && e.cluster.Name() != LocalClusterName) {
		// The deployment's namespace is in the cluster Capstan runs in;
		// another cluster has it only by chance.
		return refused, nil
	}
	unanswered := make([]error, len(objects))
	e.each(objects, func(i int, obj *unstructured.Unstructured) {
		stand := ownedBy(obj, stageOf(obj), owner)
		stand.SetNamespace(ns)
		stand.SetResourceVersion("")
		err := e.client.Create(ctx, stand, client.DryRunAll, client.FieldValidation("Strict"))
		switch {
		case err == nil:
		case IsUnanswered(err):
			unanswered[i] = err
		case apierrors.IsInvalid(err) && !fromAdmission(err):
			refused[i] = err
		}
	})
	return refused, errors.Join(unanswered...)
}

// crdKinds are the kinds the CustomResourceDefinitions among objects
// define. An object of such a kind is not dry-run in a stand-in
// namespace: the server would judge it by the schema it has now, not the
// one the plan applies first (the schema check reads the plan's).
func crdKinds(objects []*unstructured.Unstructured) map[schema.GroupKind]bool {
	kinds := map[schema.GroupKind]bool{}
	for _, obj := range objects {
		if gk, _, ok := crdScope(obj); ok {
			kinds[gk] = true
		}
	}
	return kinds
}

// fromAdmission reports whether a refusal comes from an admission webhook
// or a ValidatingAdmissionPolicy, which may judge by the namespace.
func fromAdmission(err error) bool {
	msg := serverMessage(err)
	return strings.Contains(msg, "admission webhook ") || strings.Contains(msg, "ValidatingAdmissionPolicy")
}

// standInMessage words a refusal of the stand-in dry run.
func standInMessage(err error, ns string) string {
	return "the API server refuses the object (dry run in namespace " + ns + ", its own being created by an earlier stage): " + serverMessage(err)
}

package stages

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// Some objects a deployment may apply are never deleted by a prune or by
// the deployment's deletion, whatever spec.prune says, because deleting
// them would take Capstan or other deployments down with them:
//
//   - a Namespace that holds a ClusterDeployment: the namespace controller
//     would delete the deployments in it, whose finalizers wait for
//     Capstan, while Capstan waits for the namespace to go (a deployment
//     that applies the namespace it lives in would never finish deleting);
//   - the Namespace Capstan runs in (WithHomeNamespace): Capstan itself
//     would go, halfway through;
//   - the CustomResourceDefinitions of Capstan's own API group: every
//     ClusterDeployment would go with them.
//
// They leave the inventory, as objects marked capstan.dev/prune: disabled
// do, and the result says why (PruneResult.Protected).

// WithHomeNamespace names the namespace Capstan runs in, which no prune or
// deletion removes from the cluster Capstan runs in.
func WithHomeNamespace(ns string) ExecutorOption {
	return func(e *Executor) { e.homeNamespace = ns }
}

// protects says why live must not be deleted, "" when it may be.
func (e *Executor) protects(ctx context.Context, live *unstructured.Unstructured) (string, error) {
	gk := live.GroupVersionKind().GroupKind()
	switch {
	case gk.Group == "" && gk.Kind == "Namespace":
		if e.kubeConfig == nil && e.homeNamespace != "" && live.GetName() == e.homeNamespace {
			return "Capstan runs in it", nil
		}
		return e.holdsDeployments(ctx, live.GetName())
	case gk.Group == "apiextensions.k8s.io" && gk.Kind == "CustomResourceDefinition":
		if group, _, _ := unstructured.NestedString(live.Object, "spec", "group"); group == capstanv1.GroupVersion.Group {
			return fmt.Sprintf("it defines Capstan's API (%s): every ClusterDeployment would go with it", group), nil
		}
	}
	return "", nil
}

// holdsDeployments says which ClusterDeployment namespace ns holds, ""
// for none. It asks as Capstan: a deployment's ServiceAccount may not list
// them.
func (e *Executor) holdsDeployments(ctx context.Context, ns string) (string, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(capstanv1.GroupVersion.WithKind("ClusterDeploymentList"))
	err := e.own.List(ctx, list, client.InNamespace(ns), client.Limit(1))
	switch {
	case meta.IsNoMatchError(err), apierrors.IsNotFound(err):
		return "", nil // the cluster does not serve the API: it holds none
	case err != nil:
		return "", fmt.Errorf("look for ClusterDeployments in Namespace %s before deleting it: %w", ns, err)
	case len(list.Items) == 0:
		return "", nil
	}
	return fmt.Sprintf("it holds ClusterDeployment %s/%s: deleting it would delete the deployments in it, whose finalizers wait for Capstan",
		ns, list.Items[0].GetName()), nil
}

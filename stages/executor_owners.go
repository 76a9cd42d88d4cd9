package stages

import (
	"context"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
)

// ownerLookup remembers, for one wave, which ClusterDeployments named in
// objects' owner labels still exist.
type ownerLookup struct {
	home client.Client
	mu   sync.Mutex
	seen map[Owner]bool
}

// exists reports whether the ClusterDeployment o exists in the cluster
// Capstan runs in.
func (l *ownerLookup) exists(ctx context.Context, o Owner) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ok, found := l.seen[o]; found {
		return ok, nil
	}
	cd := &metav1.PartialObjectMetadata{}
	cd.SetGroupVersionKind(capstanv1.GroupVersion.WithKind("ClusterDeployment"))
	err := l.home.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.Name}, cd)
	if meta.IsNoMatchError(err) {
		err = apierrors.NewNotFound(schema.GroupResource{Group: capstanv1.GroupVersion.Group, Resource: "clusterdeployments"}, o.Name)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("look up ClusterDeployment %s/%s: %w", o.Namespace, o.Name, err)
	}
	if l.seen == nil {
		l.seen = map[Owner]bool{}
	}
	l.seen[o] = err == nil
	return err == nil, nil
}

// check decides whether owner may apply obj over live, the object of that
// name in the cluster. An object another existing deployment applied is a
// conflict. One that no deployment applied (or whose deployment is gone)
// is adopted when the source says so (capstan.dev/adopt: "true") or when
// applying changes none of its data; a Secret only when the source says so.
func (l *ownerLookup) check(ctx context.Context, obj, live *unstructured.Unstructured, owner Owner) error {
	labels := live.GetLabels()
	current := Owner{Name: labels[OwnerNameLabel], Namespace: labels[OwnerNamespaceLabel]}
	if current == owner {
		return nil
	}
	if current.Name != "" {
		ok, err := l.exists(ctx, current)
		if err != nil {
			return err
		}
		if ok {
			return failure.Stalled(ReasonOwnershipConflict, fmt.Errorf("%s belongs to ClusterDeployment %s/%s, and %s/%s declares it too: "+
				"remove it from the source of one of them (an object has one owner; nothing of this stage was applied)",
				ObjectRef(obj), current.Namespace, current.Name, owner.Namespace, owner.Name))
		}
		// Left behind by a deployment deleted with deletionPolicy Orphan.
		return nil
	}
	if obj.GetAnnotations()[AdoptAnnotation] == "true" {
		return nil
	}
	if obj.GetKind() == "Secret" && obj.GroupVersionKind().Group == "" {
		return failure.Stalled(ReasonOwnershipConflict, fmt.Errorf("%s exists and was not applied by Capstan; a Secret is taken over only when the source annotates it %s: \"true\"",
			ObjectRef(obj), AdoptAnnotation))
	}
	if changes(live, withoutMeta(obj, live), false) {
		return failure.Stalled(ReasonOwnershipConflict, fmt.Errorf("%s exists, was not applied by Capstan and differs from the source; "+
			"to take it over, annotate it in the source with %s: \"true\"", ObjectRef(obj), AdoptAnnotation))
	}
	return nil
}

// withoutMeta returns what applying obj declares of live's data: obj's
// fields over live's, enough to tell whether obj changes any of them.
func withoutMeta(obj, live *unstructured.Unstructured) *unstructured.Unstructured {
	merged := live.DeepCopy()
	for k, v := range obj.Object {
		if k == "metadata" || k == "status" || k == "apiVersion" || k == "kind" {
			continue
		}
		merged.Object[k] = mergeValue(merged.Object[k], v)
	}
	return merged
}

// mergeValue lays declared over live the way an apply of maps does:
// maps merge key by key, anything else is replaced.
func mergeValue(live, declared any) any {
	lm, ok1 := live.(map[string]any)
	dm, ok2 := declared.(map[string]any)
	if !ok1 || !ok2 {
		return declared
	}
	out := make(map[string]any, len(lm))
	for k, v := range lm {
		out[k] = v
	}
	for k, v := range dm {
		out[k] = mergeValue(lm[k], v)
	}
	return out
}

package manifests

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// leftoverKinds are the kinds an install of the other kind may hold that
// this one must not: its RBAC. Nothing else differs between the two.
var leftoverKinds = map[string]bool{
	"ServiceAccount": true, "ClusterRole": true, "ClusterRoleBinding": true, "Role": true, "RoleBinding": true,
}

// Leftovers returns the RBAC objects that an install with the other
// Tenancy setting holds and the install opts describes does not: applying
// the multi-tenant install over a plain one must take away the plain
// install's cluster-wide bindings (server-side apply creates and changes,
// it never deletes), and the way back must take the tenancy's roles away.
// `capstan install` deletes them after applying; `capstan uninstall`
// deletes them with the rest.
func Leftovers(opts Options) ([]*unstructured.Unstructured, error) {
	mine, err := Objects(opts)
	if err != nil {
		return nil, err
	}
	other := opts
	other.Tenancy = !opts.Tenancy
	theirs, err := Objects(other)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, o := range mine {
		have[identity(o)] = true
	}
	var out []*unstructured.Unstructured
	for _, o := range theirs {
		if leftoverKinds[o.GetKind()] && !have[identity(o)] {
			out = append(out, o)
		}
	}
	return out, nil
}

func identity(o *unstructured.Unstructured) string {
	return o.GroupVersionKind().GroupKind().String() + "/" + o.GetNamespace() + "/" + o.GetName()
}

// Remove deletes objs, those already gone ignored, and says which it
// deleted: the leftovers of an install of the other kind.
func (i *Installer) Remove(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		err := i.client.Delete(ctx, o.DeepCopy())
		switch {
		case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		case err != nil:
			return fmt.Errorf("install: delete %s, which this install does not hold: %w", describe(o), err)
		default:
			fmt.Fprintf(i.progress, "deleted %s, which this install does not hold\n", describe(o))
		}
	}
	return nil
}

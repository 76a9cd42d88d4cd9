package testenv

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DeleteAll deletes every object of list's kind in namespace ns, dropping
// their finalizers first: at the end of a test the controller that would
// finalize them is gone, and a later test's controller must not spend its
// requests on them.
func DeleteAll(ctx context.Context, c client.Client, list client.ObjectList, ns string) error {
	if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("list in %s: %w", ns, err)
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return err
	}
	var errs []error
	for _, item := range items {
		obj, ok := item.(client.Object)
		if !ok {
			continue
		}
		if len(obj.GetFinalizers()) > 0 {
			patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
			obj.SetFinalizers(nil)
			if err := c.Patch(ctx, obj, patch); client.IgnoreNotFound(err) != nil {
				errs = append(errs, fmt.Errorf("drop the finalizers of %s/%s: %w", ns, obj.GetName(), err))
			}
		}
		if err := c.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("delete %s/%s: %w", ns, obj.GetName(), err))
		}
	}
	return errors.Join(errs...)
}

package reconciler

import (
	"context"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// The reconciler's own writes under sharding: the ClusterDeployment's
// (status, finalizer) need its claim, and events about a deployment come
// only from its owner.

// claimedClient asks for the claim of a ClusterDeployment before writing
// it.
type claimedClient struct {
	client.Client
	hold func(context.Context, types.NamespacedName) error
}

func (c *claimedClient) check(ctx context.Context, obj client.Object) error {
	if _, ok := obj.(*capstanv1.ClusterDeployment); !ok {
		return nil
	}
	return c.hold(ctx, client.ObjectKeyFromObject(obj))
}

func (c *claimedClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := c.check(ctx, obj); err != nil {
		return err
	}
	return c.Client.Create(ctx, obj, opts...)
}

func (c *claimedClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := c.check(ctx, obj); err != nil {
		return err
	}
	return c.Client.Update(ctx, obj, opts...)
}

func (c *claimedClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if err := c.check(ctx, obj); err != nil {
		return err
	}
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *claimedClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	if err := c.check(ctx, obj); err != nil {
		return err
	}
	return c.Client.Delete(ctx, obj, opts...)
}

func (c *claimedClient) Status() client.SubResourceWriter { return c.SubResource("status") }

func (c *claimedClient) SubResource(name string) client.SubResourceClient {
	return &claimedSubResource{SubResourceClient: c.Client.SubResource(name), check: c.check}
}

type claimedSubResource struct {
	client.SubResourceClient
	check func(context.Context, client.Object) error
}

func (c *claimedSubResource) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	if err := c.check(ctx, obj); err != nil {
		return err
	}
	return c.SubResourceClient.Create(ctx, obj, sub, opts...)
}

func (c *claimedSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if err := c.check(ctx, obj); err != nil {
		return err
	}
	return c.SubResourceClient.Update(ctx, obj, opts...)
}

func (c *claimedSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if err := c.check(ctx, obj); err != nil {
		return err
	}
	return c.SubResourceClient.Patch(ctx, obj, patch, opts...)
}

// shardEvents drops the events about deployments this replica does not
// own.
type shardEvents struct {
	recorder.EventRecorder
	owns func(types.NamespacedName) bool
}

func (e *shardEvents) mine(regarding runtime.Object) bool {
	cd, ok := regarding.(*capstanv1.ClusterDeployment)
	return !ok || e.owns(client.ObjectKeyFromObject(cd))
}

func (e *shardEvents) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	if e.mine(regarding) {
		e.EventRecorder.Eventf(regarding, related, eventtype, reason, action, note, args...)
	}
}

func (e *shardEvents) AnnotatedEventf(regarding, related runtime.Object, annotations map[string]string, eventtype, reason, action, note string, args ...any) {
	if e.mine(regarding) {
		e.EventRecorder.AnnotatedEventf(regarding, related, annotations, eventtype, reason, action, note, args...)
	}
}

package stages

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ClusterIdentifier is a Cluster that can say which cluster it reaches.
type ClusterIdentifier interface {
	// ClusterUID returns the UID of the cluster's kube-system namespace
	// (what pivot.ClusterID calls the cluster's identity), read once per
	// connection. "" with a nil error says that the connection's
	// credential may not read that namespace: it cannot tell.
	ClusterUID(ctx context.Context) (string, error)
}

var _ ClusterIdentifier = (*remoteCluster)(nil)

// clusterUID is the identity a connection learnt, kept for its life: a
// kubeconfig Secret that changes gets a new connection.
type clusterUID struct {
	mu    sync.Mutex
	known bool
	uid   string
}

// ClusterUID reads namespace kube-system through the connection, once.
// A refusal (the credential may not read it, or is not accepted) is kept
// too, as "cannot tell": asking again would get the same answer. A
// network error is not kept: the next attempt asks again.
func (r *remoteCluster) ClusterUID(ctx context.Context) (string, error) {
	r.uid.mu.Lock()
	defer r.uid.mu.Unlock()
	if r.uid.known {
		return r.uid.uid, nil
	}
	ns := &corev1.Namespace{}
	err := r.client.Get(ctx, client.ObjectKey{Name: "kube-system"}, ns)
	switch {
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err), apierrors.IsNotFound(err):
		r.uid.known = true
		return "", nil
	case err != nil:
		return "", fmt.Errorf("identify the cluster (read namespace kube-system): %w", err)
	}
	r.uid.known, r.uid.uid = true, string(ns.UID)
	return r.uid.uid, nil
}

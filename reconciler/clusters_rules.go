package reconciler

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// Which kubeconfig Secrets a deployment may use, and which clusters it may
// reach through them (docs/kubeconfigs.md):
//
//   - a deployment reads kubeconfig Secrets in its own namespace only,
//     unless it is the platform's (platform): a Cluster API Cluster it
//     renders in another namespace stalls, and so does an inventory or
//     pivot record in its status that names another namespace (status is
//     written by whoever may patch the status subresource);
//   - a kubeconfig holds only what connects (stages.CheckKubeconfig),
//     unless capstan run's --insecure-kubeconfig-* flags allow more;
//   - a deployment that acts as a ServiceAccount may not reach the
//     cluster Capstan runs in through a kubeconfig: with the kubeconfig's
//     credential it would escape its ServiceAccount's RBAC.

// ReasonCrossNamespaceRefused: a deployment names a kubeconfig Secret in
// another namespace than its own.
const ReasonCrossNamespaceRefused = "CrossNamespaceRefused"

// refusedRetry is when a deployment stalled on a kubeconfig Secret looks
// again: the fix is a change of the Secret, which nothing watches.
const refusedRetry = unreachableRetryMax

// kubeconfigRules decide which kubeconfig Secrets a deployment may read
// and which clusters it may reach through them.
type kubeconfigRules struct {
	// home is the namespace Capstan runs in, whose deployments are the
	// platform's; "" when it is not known (outside a pod, with neither
	// --leader-election-namespace nor a root source).
	home string
	// actorOf names the ServiceAccount user a deployment acts as ("" for
	// Capstan itself); nil: Capstan itself for every deployment.
	actorOf func(*capstanv1.ClusterDeployment) string
	// policy says what a kubeconfig may hold beyond what connects.
	policy stages.KubeconfigPolicy
	// homeID returns the identity of the cluster Capstan runs in.
	homeID func(context.Context) (string, error)
}

func (k *kubeconfigRules) actor(cd *capstanv1.ClusterDeployment) string {
	if k == nil || k.actorOf == nil {
		return ""
	}
	return k.actorOf(cd)
}

// platform reports whether cd is the platform's, which may read
// kubeconfig Secrets in other namespaces (the bootstrap example builds
// its Cluster in a namespace of its own): a deployment of Capstan's own
// namespace. When that namespace is not known (capstan dev, a daemon
// outside a pod), a deployment acting as Capstan itself is.
func (k *kubeconfigRules) platform(cd *capstanv1.ClusterDeployment) bool {
	if k == nil {
		return false
	}
	if k.home != "" {
		return cd.Namespace == k.home
	}
	return k.actor(cd) == ""
}

// namespaceAllowed returns nil when cd may read a kubeconfig Secret in
// namespace ns; what names where the namespace comes from, for the
// message. The refusal is stalled, and looked at again after a while.
func (k *kubeconfigRules) namespaceAllowed(cd *capstanv1.ClusterDeployment, ns, what string) error {
	if ns == cd.Namespace || k.platform(cd) {
		return nil
	}
	return &failure.Error{Reason: ReasonCrossNamespaceRefused, Policy: failure.PolicyStalled, RetryAfter: refusedRetry,
		Err: fmt.Errorf("%s is in namespace %s, not the deployment's (%s): a deployment reads kubeconfig Secrets in its own namespace only, and Capstan did not read it; "+
			"put the Secret (or the Cluster API Cluster whose Secret it is) in namespace %s (docs/kubeconfigs.md)", what, ns, cd.Namespace, cd.Namespace)}
}

// homeIdentity learns the identity of the cluster Capstan runs in once
// (the UID of its kube-system namespace), through reader.
func homeIdentity(reader client.Reader) func(context.Context) (string, error) {
	var mu sync.Mutex
	var id string
	return func(ctx context.Context) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if id != "" {
			return id, nil
		}
		got, err := pivot.ClusterID(ctx, reader)
		if err != nil {
			return "", err
		}
		id = got
		return id, nil
	}
}

// sameClusterAllowed returns nil unless cd acts as a ServiceAccount and
// cluster, built from the kubeconfig Secret name, is the cluster Capstan
// runs in. The connection learns its cluster's identity once; a
// credential that may not read namespace kube-system is not Capstan's
// own, and is used as it is.
func (k *kubeconfigRules) sameClusterAllowed(ctx context.Context, cd *capstanv1.ClusterDeployment, cluster stages.Cluster) error {
	actor := k.actor(cd)
	ident, ok := cluster.(stages.ClusterIdentifier)
	if actor == "" || !ok || k.homeID == nil {
		return nil
	}
	there, err := ident.ClusterUID(ctx)
	if err != nil {
		if stages.IsUnanswered(err) {
			return &stages.UnreachableError{Cluster: cluster.Name(), Err: err}
		}
		return err
	}
	if there == "" {
		return nil
	}
	here, err := k.homeID(ctx)
	if err != nil {
		return err
	}
	if there != here {
		return nil
	}
	return &failure.Error{Reason: stages.ReasonKubeconfigRefused, Policy: failure.PolicyStalled, RetryAfter: refusedRetry,
		Err: errors.New("its kubeconfig reaches the cluster Capstan runs in (the same kube-system namespace), and the deployment acts as ServiceAccount " +
			actorName(actor) + ": through the kubeconfig's credential it would act beyond that ServiceAccount's RBAC, so Capstan does not use it; " +
			"apply to this cluster without a kubeConfig (as the ServiceAccount), or name another cluster (docs/kubeconfigs.md)")}
}

// homeNamespace is the namespace Capstan runs in, whose deployments are
// the platform's: the pod's, else --leader-election-namespace, else the
// namespace root deployments go to (the root source's --namespace); ""
// when none is known.
func (o Options) homeNamespace() string {
	if ns := o.LeaderElection.homeNamespace(); ns != "" {
		return ns
	}
	if o.Root != nil {
		return o.Root.Namespace
	}
	return ""
}

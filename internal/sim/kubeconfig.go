package sim

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// KubeconfigFunc returns the kubeconfig of the workload cluster that
// Cluster cluster builds, or nil when the simulator should write none.
type KubeconfigFunc func(cluster types.NamespacedName) []byte

// KubeconfigSecretName is the name of the Secret that holds a Cluster's
// kubeconfig, as Cluster API names it: <cluster>-kubeconfig.
func KubeconfigSecretName(cluster string) string { return cluster + "-kubeconfig" }

// writeKubeconfig plays the KubeadmControlPlane controller writing the
// Cluster's kubeconfig Secret, as KCP v1.14 does in reconcileKubeconfig:
// once the Cluster's infrastructure is provisioned and its endpoint set,
// before the first machine exists. The kubeconfig is whatever
// Options.Kubeconfig returns: the simulator has no workload API server of
// its own to point at. The Secret is written once per control plane and
// simulator (a later pass that finds it takes it as written); the real
// controller rotates its client certificate, which the simulator does not.
func (p *pass) writeKubeconfig(kcp, cluster *unstructured.Unstructured) error {
	if p.s.opts.Kubeconfig == nil || cluster == nil || !p.infraProvisioned(cluster) || !endpointSet(cluster) {
		return nil
	}
	if p.noted(kcp, "kubeconfig") {
		return nil
	}
	data := p.s.opts.Kubeconfig(types.NamespacedName{Namespace: cluster.GetNamespace(), Name: cluster.GetName()})
	if len(data) == 0 {
		return nil
	}
	name := KubeconfigSecretName(cluster.GetName())
	created, err := p.createSecretFor(controllerKCP, kcp, name, bootstrapSecretType,
		map[string]string{clusterNameLabel: cluster.GetName()}, map[string][]byte{"value": data})
	if err != nil {
		return fmt.Errorf("write the kubeconfig of Cluster %s/%s: %w", cluster.GetNamespace(), cluster.GetName(), err)
	}
	if created {
		p.emit(controllerKCP, kcp, "kubeconfig Secret %s written for Cluster %s", name, cluster.GetName())
	}
	p.markNoted(kcp, "kubeconfig")
	return nil
}

// noted reports whether key was noted for obj.
func (p *pass) noted(obj *unstructured.Unstructured, key string) bool {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	return p.s.notes[obj.GetUID()][key]
}

// markNoted records key for obj without an event.
func (p *pass) markNoted(obj *unstructured.Unstructured, key string) {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	if p.s.notes[obj.GetUID()] == nil {
		p.s.notes[obj.GetUID()] = map[string]bool{}
	}
	p.s.notes[obj.GetUID()][key] = true
}

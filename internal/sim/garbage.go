package sim

import (
	"errors"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// collectOrphans deletes what the simulated controllers created for an
// owner that is gone: the finalizers of the real controllers, and the
// garbage collector where kube-controller-manager does not run. A host
// is always given back before its Metal3Machine goes. Nothing of a paused
// Cluster is touched, and of a missing Cluster only what the simulator
// created itself: during a pivot, objects arrive in the target before
// their owners.
func (p *pass) collectOrphans() error {
	var errs []error
	gone := func(obj *unstructured.Unstructured, owner schema.GroupVersionKind) bool {
		ref := controllerRef(obj)
		if ref == nil || ref.Kind != owner.Kind || p.w.byUID(owner, ref.UID) != nil {
			return false
		}
		if c := p.w.get(kindCluster, obj.GetLabels()[clusterNameLabel]); c != nil {
			return !clusterPaused(c)
		}
		return createdBySimulator(obj)
	}
	for _, ms := range p.w.list(kindMachineSet) {
		if gone(ms, kindMachineDeployment) {
			errs = append(errs, p.remove(ms))
		}
	}
	for _, m := range p.w.list(kindMachine) {
		if gone(m, kindKubeadmControlPlane) || gone(m, kindMachineSet) {
			errs = append(errs, p.deleteMachine(controllerCAPI, m, "its owner is gone"))
		}
	}
	for _, m3m := range p.w.list(kindMetal3Machine) {
		if gone(m3m, kindMachine) {
			errs = append(errs, p.deleteMetal3Machine(m3m))
		}
	}
	for _, kc := range p.w.list(kindKubeadmConfig) {
		if gone(kc, kindMachine) {
			errs = append(errs, p.deleteBootstrapConfig(kc))
		}
	}
	for _, claim := range p.w.list(kindIPClaim) {
		if gone(claim, kindMetal3Data) {
			for _, a := range p.w.owned(kindIPAddress, claim) {
				errs = append(errs, p.remove(a))
			}
			errs = append(errs, p.remove(claim))
			if pool := p.w.get(kindIPPool, str(claim.Object, "spec", "pool", "name")); pool != nil {
				errs = append(errs, p.recordAllocations(pool))
			}
		}
	}
	for _, claim := range p.w.list(kindMetal3DataClaim) {
		if gone(claim, kindMetal3Machine) {
			errs = append(errs, p.deleteDataClaim(claim))
		}
	}
	return errors.Join(errs...)
}

// createdBySimulator reports whether one of the simulated controllers
// created obj (wrote its main resource, not only its status).
func createdBySimulator(obj *unstructured.Unstructured) bool {
	for _, f := range obj.GetManagedFields() {
		if strings.HasPrefix(f.Manager, fieldManager("")) && f.Operation == "Update" && f.Subresource == "" {
			return true
		}
	}
	return false
}

package sim

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// bootstrapSecretType is the type of the Secrets the kubeadm bootstrap
// provider renders.
const bootstrapSecretType = "cluster.x-k8s.io/secret"

// reconcileBootstrapConfigs plays the kubeadm bootstrap provider (CABPK):
// the first control-plane machine gets `kubeadm init` data as soon as the
// Cluster's infrastructure is provisioned; every other machine gets
// `kubeadm join` data only once the control plane is initialized (seed
// 002, steps 6 and 15).
func (p *pass) reconcileBootstrapConfigs() error {
	var errs []error
	for _, kc := range p.w.list(kindKubeadmConfig) {
		if kc.GetDeletionTimestamp() != nil {
			continue
		}
		ref := controllerRef(kc)
		if ref == nil || ref.Kind != kindMachine.Kind {
			continue
		}
		machine := p.w.byUID(kindMachine, ref.UID)
		cluster := p.clusterOf(machine)
		if machine == nil || cluster == nil || clusterPaused(cluster) {
			continue
		}
		if err := p.reconcileBootstrapConfig(kc, machine, cluster); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *pass) reconcileBootstrapConfig(kc, machine, cluster *unstructured.Unstructured) error {
	next := kc.DeepCopy()
	set(next.Object, kc.GetGeneration(), "status", "observedGeneration")
	created := flag(kc.Object, "status", "initialization", "dataSecretCreated")
	_, controlPlane := machine.GetLabels()[controlPlaneLabel]
	cpInit := flag(cluster.Object, "status", "initialization", "controlPlaneInitialized")
	// The control plane's first machine carries initConfiguration.
	init := controlPlane && !cpInit && has(kc.Object, "spec", "initConfiguration")
	waiting := ""
	switch {
	case created:
	case !flag(cluster.Object, "status", "initialization", "infrastructureProvisioned"):
		waiting = "waiting for the Cluster's infrastructure"
	case !init && !cpInit:
		waiting = "waiting for the control plane to be initialized before joining"
	case p.waited(kc, "render", p.s.delays.Default):
		action := "join"
		if init {
			action = "init"
		}
		secret := kc.GetName()
		content := []byte(fmt.Sprintf("## template: jinja\n#cloud-config\n# kubeadm %s for Machine %s/%s at %s, rendered by the capstan simulator\nruncmd:\n  - kubeadm %s\n",
			action, machine.GetNamespace(), machine.GetName(), str(machine.Object, "spec", "version"), action))
		if err := p.createSecret(controllerCABPK, kc, secret, bootstrapSecretType, map[string]any{"value": content, "format": []byte("cloud-config")}); err != nil {
			return err
		}
		set(next.Object, secret, "status", "dataSecretName")
		set(next.Object, true, "status", "initialization", "dataSecretCreated")
		created = true
	default:
		waiting = "rendering the bootstrap data"
	}
	setConditions(next, p.now,
		conditionIf(created, "Ready", "Ready", "NotReady", waiting),
		conditionIf(created, "DataSecretAvailable", "Available", "NotAvailable", waiting),
		condition{typ: "CertificatesAvailable", status: "True", reason: "Available"},
		notPaused,
	)
	wrote, err := p.updateStatus(controllerCABPK, kc, next)
	if err != nil {
		return err
	}
	if wrote && created && !flag(kc.Object, "status", "initialization", "dataSecretCreated") {
		p.forget(kc, "render")
		p.emit(controllerCABPK, next, "bootstrap data rendered into Secret %s", str(next.Object, "status", "dataSecretName"))
	}
	return nil
}

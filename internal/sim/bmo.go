package sim

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// The BareMetal Operator's provisioning states (status.provisioning.state)
// the simulator walks a host through.
const (
	hostRegistering    = "registering"
	hostInspecting     = "inspecting"
	hostPreparing      = "preparing"
	hostAvailable      = "available"
	hostProvisioning   = "provisioning"
	hostProvisioned    = "provisioned"
	hostDeprovisioning = "deprovisioning"
)

// hostPausedAnnotation stops the BareMetal Operator from touching a host;
// a pivot sets it while it moves the host.
const hostPausedAnnotation = "baremetalhost.metal3.io/paused"

// reconcileHosts plays the BareMetal Operator: registering -> inspecting
// -> preparing -> available, then provisioning -> provisioned once CAPM3
// has given the host an image, and deprovisioning -> available once CAPM3
// releases it.
func (p *pass) reconcileHosts() error {
	var errs []error
	for _, h := range p.w.list(kindBareMetalHost) {
		if h.GetDeletionTimestamp() != nil {
			continue
		}
		if _, paused := h.GetAnnotations()[hostPausedAnnotation]; paused {
			continue
		}
		if err := p.reconcileHost(h); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *pass) reconcileHost(h *unstructured.Unstructured) error {
	next := h.DeepCopy()
	d := p.s.delays
	state := str(h.Object, "status", "provisioning", "state")
	to := "" // the state the host moves to, if any
	switch state {
	case "":
		to = hostRegistering
		p.history(next, "register", "start")
	case hostRegistering:
		ok, err := p.credentialsFound(next)
		if err != nil {
			return err
		}
		if ok && p.waited(h, state, d.HostRegistration) {
			to = hostInspecting
			set(next.Object, hostUUID(h.GetUID()), "status", "provisioning", "ID")
			p.history(next, "register", "end")
			p.history(next, "inspect", "start")
		}
	case hostInspecting:
		if p.waited(h, state, d.HostInspection) {
			to = hostPreparing
			set(next.Object, hardwareDetails(h), "status", "hardware")
			set(next.Object, "unknown", "status", "hardwareProfile")
			p.history(next, "inspect", "end")
		}
	case hostPreparing:
		if p.waited(h, state, d.HostInspection) {
			to = hostAvailable
		}
	case hostAvailable, "ready":
		if wantsImage(h) {
			to = hostProvisioning
			p.history(next, "provision", "start")
		}
	case hostProvisioning:
		var failed bool
		to, failed = p.provisioning(h, next)
		if failed {
			return p.failProvisioning(h, next)
		}
	case hostProvisioned:
		if !wantsImage(h) {
			to = hostDeprovisioning
			p.history(next, "deprovision", "start")
		}
	case hostDeprovisioning:
		if p.waited(h, state, d.HostDeprovisioning) {
			to = hostAvailable
			p.history(next, "deprovision", "end")
			unset(next.Object, "status", "provisioning", "image")
			set(next.Object, false, "status", "poweredOn")
			clearHostError(next)
		}
	}
	if to != "" {
		set(next.Object, to, "status", "provisioning", "state")
	}
	defaultHostStatus(next)
	setConditions(next, p.now, hostConditions(next)...)
	wrote, err := p.updateStatus(controllerBMO, h, next)
	if err != nil {
		return err
	}
	if wrote && to != "" {
		p.forget(h, state)
		from := state
		if from == "" {
			from = "(new)"
		}
		if str(next.Object, "status", "operationalStatus") == "error" {
			p.emit(controllerBMO, next, "%s: %s (%s)", str(next.Object, "status", "errorType"), str(next.Object, "status", "errorMessage"), to)
		} else {
			p.emit(controllerBMO, next, "%s -> %s", from, to)
		}
	}
	return nil
}

// provisioning decides what happens to a host in provisioning: the state
// it moves to, if any, or that this attempt fails.
func (p *pass) provisioning(h, next *unstructured.Unstructured) (to string, fail bool) {
	if !wantsImage(h) {
		// CAPM3 took the image back before the host finished.
		p.history(next, "deprovision", "start")
		return hostDeprovisioning, false
	}
	if str(h.Object, "status", "errorType") != "" {
		// A failed deployment is cleaned up before the next attempt.
		if p.waited(h, "failed", p.s.delays.Default) {
			p.forget(h, "failed")
			p.history(next, "deprovision", "start")
			return hostDeprovisioning, false
		}
		return "", false
	}
	if p.s.fault(h) == FaultStuckProvisioning {
		p.note(controllerBMO, h, "stuck", "held in provisioning by fault %s", FaultStuckProvisioning)
		return "", false
	}
	p.unnote(h, "stuck")
	if !p.waited(h, hostProvisioning, p.s.delays.HostProvisioning) {
		return "", false
	}
	if p.s.failPending(h) {
		return "", true
	}
	spec := object(h.Object, "spec")
	set(next.Object, true, "status", "poweredOn")
	if img := object(spec, "image"); img != nil {
		set(next.Object, img, "status", "provisioning", "image")
	}
	if hints := object(spec, "rootDeviceHints"); hints != nil {
		set(next.Object, hints, "status", "provisioning", "rootDeviceHints")
	}
	clearHostError(next)
	set(next.Object, int64(0), "status", "errorCount")
	p.history(next, "provision", "end")
	return hostProvisioned, false
}

// failProvisioning ends the host's provisioning attempt in a provisioning
// error, the one failure of FaultProvisionFailsOnce.
func (p *pass) failProvisioning(h, next *unstructured.Unstructured) error {
	errCount, _ := integer(h.Object, "status", "errorCount")
	set(next.Object, "error", "status", "operationalStatus")
	set(next.Object, "provisioning error", "status", "errorType")
	set(next.Object, "simulated: image deployment failed (fault "+string(FaultProvisionFailsOnce)+")", "status", "errorMessage")
	set(next.Object, errCount+1, "status", "errorCount")
	setConditions(next, p.now, hostConditions(next)...)
	if _, err := p.updateStatus(controllerBMO, h, next); err != nil {
		return err
	}
	p.s.markFailed(h)
	p.forget(h, hostProvisioning)
	p.emit(controllerBMO, next, "provisioning error: image deployment failed (fault %s)", FaultProvisionFailsOnce)
	return nil
}

// wantsImage reports whether CAPM3 has asked for the host to be
// provisioned: it has a consumer and an image (or a custom deploy).
func wantsImage(h *unstructured.Unstructured) bool {
	spec := object(h.Object, "spec")
	return object(spec, "consumerRef") != nil &&
		(str(spec, "image", "url") != "" || str(spec, "customDeploy", "method") != "")
}

// credentialsFound checks that the host's BMC Secret exists; without it
// the host stays registering with a registration error, as the BareMetal
// Operator leaves it.
func (p *pass) credentialsFound(next *unstructured.Unstructured) (bool, error) {
	name := str(next.Object, "spec", "bmc", "credentialsName")
	var err error
	if name != "" {
		err = p.s.api.Get(p.ctx, types.NamespacedName{Namespace: next.GetNamespace(), Name: name}, &corev1.Secret{})
	}
	switch {
	case name == "" || apierrors.IsNotFound(err):
		set(next.Object, "error", "status", "operationalStatus")
		set(next.Object, "registration error", "status", "errorType")
		set(next.Object, fmt.Sprintf("BMC credentials secret %q not found", name), "status", "errorMessage")
		p.wakeIn(time.Second) // Secrets are not watched
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read BMC secret of BareMetalHost %s/%s: %w", next.GetNamespace(), next.GetName(), err)
	}
	if str(next.Object, "status", "errorType") == "registration error" {
		clearHostError(next)
	}
	set(next.Object, map[string]any{"credentials": map[string]any{"name": name, "namespace": next.GetNamespace()}}, "status", "goodCredentials")
	return true, nil
}

func clearHostError(h *unstructured.Unstructured) {
	set(h.Object, "OK", "status", "operationalStatus")
	set(h.Object, "", "status", "errorMessage")
	unset(h.Object, "status", "errorType")
}

// defaultHostStatus fills the fields the CRD requires in every status.
func defaultHostStatus(h *unstructured.Unstructured) {
	st := object(h.Object, "status")
	if _, ok := st["operationalStatus"]; !ok {
		set(h.Object, "OK", "status", "operationalStatus")
	}
	if _, ok := st["errorMessage"]; !ok {
		set(h.Object, "", "status", "errorMessage")
	}
	if _, ok := st["errorCount"]; !ok {
		set(h.Object, int64(0), "status", "errorCount")
	}
	if _, ok := st["poweredOn"]; !ok {
		set(h.Object, false, "status", "poweredOn")
	}
	if !has(h.Object, "status", "provisioning", "ID") {
		set(h.Object, "", "status", "provisioning", "ID")
	}
	if mode := str(h.Object, "spec", "bootMode"); mode != "" {
		set(h.Object, mode, "status", "provisioning", "bootMode")
	}
}

// history stamps status.operationHistory.<op>.<edge> (start or end).
func (p *pass) history(h *unstructured.Unstructured, op, edge string) {
	if edge == "start" {
		unset(h.Object, "status", "operationHistory", op, "end")
	}
	set(h.Object, p.now.UTC().Format(time.RFC3339), "status", "operationHistory", op, edge)
}

// hostConditions are the conditions the BareMetal Operator v0.13 computes
// from the provisioning state and operational status.
func hostConditions(h *unstructured.Unstructured) []condition {
	state := str(h.Object, "status", "provisioning", "state")
	errored := str(h.Object, "status", "operationalStatus") == "error"
	progressing := func(reason string) []condition {
		return []condition{
			{typ: "Manageable", status: "True", reason: "Manageable"},
			{typ: "AvailableForProvisioning", status: "False", reason: "NotAvailable"},
			{typ: "Provisioned", status: "False", reason: "NotProvisioned"},
			{typ: "Ready", status: "False", reason: "NotProvisioned"},
			{typ: "Progressing", status: "True", reason: reason},
		}
	}
	var cs []condition
	switch state {
	case hostRegistering:
		reason := "Registering"
		if errored {
			reason = "RegistrationFailed"
		}
		cs = []condition{
			{typ: "Manageable", status: "False", reason: reason},
			{typ: "AvailableForProvisioning", status: "False", reason: "NotAvailable"},
			{typ: "Provisioned", status: "False", reason: "NotProvisioned"},
			{typ: "Ready", status: "False", reason: "NotProvisioned"},
			{typ: "Progressing", status: "True", reason: "Registering"},
		}
	case hostInspecting:
		cs = progressing("Inspecting")
	case hostPreparing:
		cs = progressing("Preparing")
	case hostAvailable, "ready":
		cs = []condition{
			{typ: "Manageable", status: "True", reason: "Manageable"},
			{typ: "AvailableForProvisioning", status: "True", reason: "Available"},
			{typ: "Provisioned", status: "False", reason: "NotProvisioned"},
			{typ: "Ready", status: "False", reason: "NotProvisioned"},
			{typ: "Progressing", status: "False", reason: "NotProgressing"},
		}
	case hostProvisioning:
		cs = progressing("Provisioning")
	case hostProvisioned:
		cs = []condition{
			{typ: "Manageable", status: "True", reason: "Manageable"},
			{typ: "AvailableForProvisioning", status: "False", reason: "NotAvailable"},
			{typ: "Provisioned", status: "True", reason: "Provisioned"},
			{typ: "Ready", status: "True", reason: "Provisioned"},
			{typ: "Progressing", status: "False", reason: "NotProgressing"},
		}
	case hostDeprovisioning:
		cs = progressing("Deprovisioning")
	}
	if errored {
		cs = append(cs, condition{typ: "Ready", status: "False", reason: "Error", message: str(h.Object, "status", "errorMessage")})
	}
	return append(cs, condition{typ: "Healthy", status: "Unknown", reason: "Unknown"})
}

// hostUUID is the Ironic node UUID the simulator gives a host
// (status.provisioning.ID): stable for the host, unlike a random one.
func hostUUID(uid types.UID) string {
	b := sha256.Sum256([]byte("ironic/" + string(uid)))
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// hardwareDetails is what inspection finds: one NIC (the boot MAC), one
// disk, a plausible server.
func hardwareDetails(h *unstructured.Unstructured) map[string]any {
	mac := str(h.Object, "spec", "bootMACAddress")
	if mac == "" {
		sum := sha256.Sum256([]byte(h.GetUID()))
		mac = fmt.Sprintf("02:00:%02x:%02x:%02x:%02x", sum[0], sum[1], sum[2], sum[3])
	}
	sum := sha256.Sum256([]byte("ip/" + h.GetUID()))
	return map[string]any{
		"hostname":     h.GetName(),
		"ramMebibytes": int64(65536),
		"cpu":          map[string]any{"arch": "x86_64", "model": "Simulated CPU @ 2.40GHz", "count": int64(16), "clockMegahertz": float64(2400)},
		"nics": []any{map[string]any{
			"name": "enp1s0", "mac": mac, "ip": fmt.Sprintf("198.18.%d.%d", sum[0], 1+int(sum[1])%253),
			"speedGbps": int64(10), "pxe": true, "model": "0x8086 0x1572",
		}},
		"storage": []any{map[string]any{
			"name": "/dev/sda", "sizeBytes": int64(480103981056), "type": "SSD", "rotational": false,
			"model": "Simulated SSD", "serialNumber": fmt.Sprintf("SIM%x", sum[2:6]),
		}},
		"systemVendor": map[string]any{"manufacturer": "Capstan", "productName": "Simulated Server", "serialNumber": fmt.Sprintf("%x", sum[6:12])},
		"firmware":     map[string]any{"bios": map[string]any{"vendor": "Capstan", "version": "1.0", "date": "01/01/2026"}},
	}
}

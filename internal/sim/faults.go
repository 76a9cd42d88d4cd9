package sim

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Fault is a failure injected into one BareMetalHost.
type Fault string

const (
	// FaultStuckProvisioning holds the host in provisioning, operational
	// status OK, until the fault is cleared: an image that never finishes
	// writing, a host that never comes back from its reboot.
	FaultStuckProvisioning Fault = "StuckProvisioning"
	// FaultProvisionFailsOnce ends the host's first provisioning in a
	// provisioning error (operationalStatus error, errorType "provisioning
	// error"); the BareMetal Operator deprovisions it, and the next attempt
	// succeeds.
	FaultProvisionFailsOnce Fault = "ProvisionFailsOnce"
)

func (f Fault) validate() error {
	switch f {
	case FaultStuckProvisioning, FaultProvisionFailsOnce:
		return nil
	}
	return fmt.Errorf("unknown fault %q (known: %s, %s)", f, FaultStuckProvisioning, FaultProvisionFailsOnce)
}

// SetFault injects f into the BareMetalHost named host ("name" in any
// namespace, or "namespace/name"), replacing its fault if it has one. It
// takes effect at the host's next step.
func (s *Simulator) SetFault(host string, f Fault) error {
	if err := f.validate(); err != nil {
		return fmt.Errorf("set fault on %s: %w", host, err)
	}
	s.mu.Lock()
	s.faults[host] = f
	s.mu.Unlock()
	s.wakeAll()
	return nil
}

// ClearFault removes the fault of host, set by Options.Faults or SetFault.
// A host held in provisioning finishes at once, its provisioning delay
// having long passed.
func (s *Simulator) ClearFault(host string) {
	s.mu.Lock()
	delete(s.faults, host)
	s.mu.Unlock()
	s.wakeAll()
}

// fault returns the fault injected into host, by namespace/name first.
func (s *Simulator) fault(host *unstructured.Unstructured) Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.faults[host.GetNamespace()+"/"+host.GetName()]; ok {
		return f
	}
	return s.faults[host.GetName()]
}

// failPending reports whether host is to fail its provisioning now: it
// has FaultProvisionFailsOnce and has not failed yet.
func (s *Simulator) failPending(host *unstructured.Unstructured) bool {
	if s.fault(host) != FaultProvisionFailsOnce {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.failed[host.GetUID()]
}

// markFailed records that host has had its one failure.
func (s *Simulator) markFailed(host *unstructured.Unstructured) {
	s.mu.Lock()
	s.failed[host.GetUID()] = true
	s.mu.Unlock()
}

package sim

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Delays is how long each simulated step takes, counted from when the
// simulator first sees the step due. A zero field takes Default; a zero
// Default makes those steps immediate.
type Delays struct {
	// HostRegistration: BareMetalHost registering -> inspecting.
	HostRegistration time.Duration
	// HostInspection: inspecting -> preparing -> available, each.
	HostInspection time.Duration
	// HostProvisioning: provisioning -> provisioned (or the failure).
	HostProvisioning time.Duration
	// HostDeprovisioning: deprovisioning -> available.
	HostDeprovisioning time.Duration
	// MachineBoot: from a provisioned host to its node joining the
	// cluster, when CAPM3 sets the providerID.
	MachineBoot time.Duration
	// Default: every other step (endpoint accepted, bootstrap data
	// rendered, node matched, probe succeeded, ...).
	Default time.Duration
}

// TestDelays returns delays for tests: a whole cluster takes well under a
// second per machine.
func TestDelays() Delays {
	return Delays{
		HostRegistration:   10 * time.Millisecond,
		HostInspection:     20 * time.Millisecond,
		HostProvisioning:   50 * time.Millisecond,
		HostDeprovisioning: 20 * time.Millisecond,
		MachineBoot:        30 * time.Millisecond,
		Default:            10 * time.Millisecond,
	}
}

// DemoDelays returns delays for `capstan dev`: slow enough to watch every
// stage go by, a three-machine control plane with two workers is ready in
// about half a minute.
func DemoDelays() Delays {
	return Delays{
		HostRegistration:   500 * time.Millisecond,
		HostInspection:     1500 * time.Millisecond,
		HostProvisioning:   2 * time.Second,
		HostDeprovisioning: time.Second,
		MachineBoot:        1500 * time.Millisecond,
		Default:            500 * time.Millisecond,
	}
}

func (d Delays) withDefaults() Delays {
	for _, f := range []*time.Duration{&d.HostRegistration, &d.HostInspection, &d.HostProvisioning, &d.HostDeprovisioning, &d.MachineBoot} {
		if *f == 0 {
			*f = d.Default
		}
	}
	return d
}

func (d Delays) validate() error {
	var errs []error
	for name, v := range map[string]time.Duration{
		"HostRegistration": d.HostRegistration, "HostInspection": d.HostInspection,
		"HostProvisioning": d.HostProvisioning, "HostDeprovisioning": d.HostDeprovisioning,
		"MachineBoot": d.MachineBoot, "Default": d.Default,
	} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("delays.%s %s is negative", name, v))
		}
	}
	return errors.Join(errs...)
}

// waited reports whether step has been due on obj for d. The first call
// starts the clock; until d has passed it asks for a pass when it will
// have, and returns false.
func (p *pass) waited(obj *unstructured.Unstructured, step string, d time.Duration) bool {
	s := p.s
	s.mu.Lock()
	steps := s.since[obj.GetUID()]
	if steps == nil {
		steps = map[string]time.Time{}
		s.since[obj.GetUID()] = steps
	}
	start, ok := steps[step]
	if !ok {
		start = p.now
		steps[step] = start
	}
	s.mu.Unlock()
	left := d - p.now.Sub(start)
	if left <= 0 {
		return true
	}
	p.wakeIn(left)
	return false
}

// forget resets the clock of step on obj, once the step is done, so that
// the same step starts afresh when it comes round again.
func (p *pass) forget(obj *unstructured.Unstructured, step string) {
	p.s.mu.Lock()
	delete(p.s.since[obj.GetUID()], step)
	p.s.mu.Unlock()
}

// wakeIn asks for another pass over the namespace after d.
func (p *pass) wakeIn(d time.Duration) {
	if d <= 0 {
		d = time.Millisecond
	}
	if p.wake == 0 || d < p.wake {
		p.wake = d
	}
}

package sim

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Event is one thing the simulator did, as a user would say it:
// "BareMetalHost demo/node-0: inspecting -> available".
type Event struct {
	// Time is when the change was written.
	Time time.Time
	// Controller is the simulated controller that made the change:
	// "baremetal-operator", "capm3", "cluster-api", "kubeadm-control-plane"
	// or "kubeadm-bootstrap".
	Controller string
	// Kind, Namespace and Name identify the object changed.
	Kind, Namespace, Name string
	// Message says what changed.
	Message string
}

// String returns the event as one line: "Kind namespace/name: message".
func (e Event) String() string {
	return fmt.Sprintf("%s %s/%s: %s", e.Kind, e.Namespace, e.Name, e.Message)
}

// The simulated controllers, as they appear in Event.Controller and, with
// the prefix "capstan-sim-", as field managers.
const (
	controllerBMO   = "baremetal-operator"
	controllerCAPM3 = "capm3"
	controllerCAPI  = "cluster-api"
	controllerKCP   = "kubeadm-control-plane"
	controllerCABPK = "kubeadm-bootstrap"
)

func fieldManager(controller string) string { return "capstan-sim-" + controller }

// emit reports a change to obj made by controller.
func (p *pass) emit(controller string, obj *unstructured.Unstructured, format string, args ...any) {
	e := Event{
		Time:       time.Now(),
		Controller: controller,
		Kind:       obj.GetKind(),
		Namespace:  obj.GetNamespace(),
		Name:       obj.GetName(),
		Message:    fmt.Sprintf(format, args...),
	}
	p.s.emitMu.Lock()
	defer p.s.emitMu.Unlock()
	p.s.log.Info(e.String(), "controller", controller)
	if p.s.opts.Events != nil {
		p.s.opts.Events(e)
	}
}

// note emits an event about obj once for as long as the simulator knows
// the object: "held in provisioning by fault" is news once.
func (p *pass) note(controller string, obj *unstructured.Unstructured, key, format string, args ...any) {
	s := p.s
	s.mu.Lock()
	seen := s.notes[obj.GetUID()]
	if seen == nil {
		seen = map[string]bool{}
		s.notes[obj.GetUID()] = seen
	}
	first := !seen[key]
	seen[key] = true
	s.mu.Unlock()
	if first {
		p.emit(controller, obj, format, args...)
	}
}

// unnote forgets a one-off event, so that it is news again.
func (p *pass) unnote(obj *unstructured.Unstructured, key string) {
	p.s.mu.Lock()
	delete(p.s.notes[obj.GetUID()], key)
	p.s.mu.Unlock()
}

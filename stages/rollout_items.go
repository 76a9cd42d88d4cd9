package stages

import (
	"fmt"
	"maps"
	"slices"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
)

// The judgements in this file are pure functions of an LCMCluster and an
// LCMMachine as they are in the cluster: what the machine should run, and
// how far it has come. The rollout derives everything it does from them,
// which is what lets a restarted daemon continue where the last one
// stopped.

// targetItems is the StateItem list a rollout of phase gives machine m of
// cluster c. A deploy rollout gives the whole list of the machine's type.
// A prepare rollout gives the type's prepare items and keeps whatever
// else the machine runs already, so a deployed machine fetches the next
// release without losing its deploy items.
func targetItems(c *lcmv1.LCMCluster, m *lcmv1.LCMMachine, phase lcmv1.StatePhase) []lcmv1.StateItem {
	desired := desiredItems(c, m.Spec.Type)
	if phase != lcmv1.StatePhasePrepare {
		return desired
	}
	target := make([]lcmv1.StateItem, 0, len(desired)+len(m.Spec.StateItems))
	for _, item := range desired {
		if item.Phase == lcmv1.StatePhasePrepare {
			target = append(target, item)
		}
	}
	for _, item := range m.Spec.StateItems {
		if item.Phase != lcmv1.StatePhasePrepare {
			target = append(target, item)
		}
	}
	return target
}

// desiredItems is the LCMCluster's StateItem list for a machine type.
func desiredItems(c *lcmv1.LCMCluster, t lcmv1.MachineType) []lcmv1.StateItem {
	if t == lcmv1.MachineTypeManager {
		return c.Spec.MachineTypes.Manager
	}
	return c.Spec.MachineTypes.Worker
}

// sameItems reports whether two StateItem lists hold the same items, by
// name, whatever their order (the API keeps them as a map keyed by name).
func sameItems(a, b []lcmv1.StateItem) bool {
	return len(a) == len(b) && sameItemsOf(a, b, func(lcmv1.StateItem) bool { return true })
}

// sameItemsOf compares the items keep selects from each list.
func sameItemsOf(a, b []lcmv1.StateItem, keep func(lcmv1.StateItem) bool) bool {
	index := func(items []lcmv1.StateItem) map[string]lcmv1.StateItem {
		out := map[string]lcmv1.StateItem{}
		for _, item := range items {
			if keep(item) {
				out[item.Name] = item
			}
		}
		return out
	}
	ia, ib := index(a), index(b)
	if len(ia) != len(ib) {
		return false
	}
	for name, x := range ia {
		y, ok := ib[name]
		if !ok || x.Phase != y.Phase || x.Runner != y.Runner || x.Version != y.Version || !maps.Equal(x.Params, y.Params) {
			return false
		}
	}
	return true
}

// settled reports whether the agent has seen the machine's current spec
// and finished every item of it.
func settled(m *lcmv1.LCMMachine) bool {
	return m.Status.ObservedGeneration == m.Generation && len(m.PendingItems()) == 0
}

// reported reports whether the machine's agent has reported in: a
// machine is handed items only then.
func reported(m *lcmv1.LCMMachine) bool {
	switch m.Status.State {
	case "", lcmv1.MachineStateUninitialized:
		return false
	}
	return true
}

// disrupting reports whether the agent is at work on items that touch the
// node's workloads (deploy or reconfigure), which is what the batch limits
// count. Prepare items only fetch and install, and count for nothing.
func disrupting(m *lcmv1.LCMMachine) bool {
	return slices.ContainsFunc(m.PendingItems(), func(i lcmv1.StateItem) bool { return i.Phase != lcmv1.StatePhasePrepare })
}

// needsDrain reports whether handing target to m upgrades a worker that
// runs workloads: its deploy items change on a machine already deployed.
// A reconfiguration or a new prepare item does not move workloads.
func needsDrain(m *lcmv1.LCMMachine, target []lcmv1.StateItem) bool {
	if m.Spec.Type != lcmv1.MachineTypeWorker || !m.DeployedBefore() {
		return false
	}
	return !sameItemsOf(m.Spec.StateItems, target, func(i lcmv1.StateItem) bool { return i.Phase == lcmv1.StatePhaseDeploy })
}

// progress is how far a machine is on the way to its target items.
type progress int

const (
	// progressUnreported: the agent has not reported the machine yet.
	progressUnreported progress = iota
	// progressOutdated: the machine's spec is not the target yet.
	progressOutdated
	// progressBusy: the machine has its target and its agent is at it.
	progressBusy
	// progressDone: the machine runs its target, every item succeeded.
	progressDone
)

// progressOf judges machine m against its target for a rollout of phase.
// A deployed machine is done only once its agent says Ready, unless its
// type has no deploy items at all.
func progressOf(m *lcmv1.LCMMachine, target []lcmv1.StateItem, phase lcmv1.StatePhase) progress {
	switch {
	case !sameItems(m.Spec.StateItems, target):
		if !reported(m) {
			return progressUnreported
		}
		return progressOutdated
	case !settled(m):
		return progressBusy
	case phase == lcmv1.StatePhaseDeploy && m.Status.State != lcmv1.MachineStateReady &&
		slices.ContainsFunc(target, func(i lcmv1.StateItem) bool { return i.Phase == lcmv1.StatePhaseDeploy }):
		return progressBusy
	}
	return progressDone
}

// describeWork says what a machine's agent is doing, for a stage message:
// its state and its first unfinished item.
func describeWork(m *lcmv1.LCMMachine) string {
	s := fmt.Sprintf("%s %s", m.Name, stateOrUnknown(m.Status.State))
	if m.Status.ObservedGeneration != m.Generation {
		return s + " (agent has not seen the new items yet)"
	}
	pending := m.PendingItems()
	if len(pending) == 0 {
		return s
	}
	item := pending[0]
	r, ok := m.Result(item.Name)
	if !ok || r.Version != item.Version {
		return fmt.Sprintf("%s (%s %s not started)", s, item.Name, item.Version)
	}
	s = fmt.Sprintf("%s (%s %s %s, attempt %d", s, item.Name, item.Version, r.State, r.Attempts)
	if r.State == lcmv1.StateItemFailed {
		if r.ExitCode != nil {
			s += fmt.Sprintf(", exit code %d", *r.ExitCode)
		}
		if r.Message != "" {
			s += ": " + r.Message
		}
	}
	return s + ")"
}

// failing reports whether the machine's last run of an item failed.
func failing(m *lcmv1.LCMMachine) bool {
	for _, item := range m.PendingItems() {
		if r, ok := m.Result(item.Name); ok && r.Version == item.Version && r.State == lcmv1.StateItemFailed {
			return true
		}
	}
	return false
}

func stateOrUnknown(s lcmv1.MachineState) string {
	if s == "" {
		return "(no state reported)"
	}
	return string(s)
}

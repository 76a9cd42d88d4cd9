package stages

import (
	"fmt"
	"strings"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
)

// rolloutSettings is a rollout stage's configuration, defaults filled in.
type rolloutSettings struct {
	// machineType limits the stage to one type; empty means every
	// machine, managers first.
	machineType lcmv1.MachineType
	// phase is prepare or deploy.
	phase lcmv1.StatePhase
	// batch is how many workers may deploy or upgrade at once.
	batch int
	// limit, when above zero, ends the stage once that many of its
	// machines are done, and starts no more than it takes.
	limit int
}

// covers reports whether the stage acts on machines of type t.
func (s rolloutSettings) covers(t lcmv1.MachineType) bool {
	return s.machineType == "" || s.machineType == t
}

// rolloutMachine is one LCMMachine as the rollout sees it, with what it
// knows of the machine's Node.
type rolloutMachine struct {
	*lcmv1.LCMMachine
	// NodeFound tells whether a Node named status.hostname exists.
	NodeFound bool
	// DrainMark is the rollout's annotation on that Node (drainMarkKey):
	// empty unless the rollout has cordoned the Node for an upgrade.
	DrainMark string
}

// rolloutCluster is an LCMCluster and the machines of the stage that
// belong to it, read from the cluster in one go.
type rolloutCluster struct {
	Namespace, Name string
	// Cluster is nil when the LCMCluster does not exist (yet).
	Cluster *lcmv1.LCMCluster
	// Machines are sorted by name.
	Machines []rolloutMachine
}

func (c rolloutCluster) ref() string { return "LCMCluster/" + c.Namespace + "/" + c.Name }

// handOut gives a machine its target items; a worker to upgrade gets them
// only once its Node is cordoned and drained.
type handOut struct {
	Machine rolloutMachine
	Items   []lcmv1.StateItem
	Drain   bool
}

// rolloutStep is what the rollout does next for one cluster and what it
// then waits for. It is computed from the cluster's state alone.
type rolloutStep struct {
	// HandOuts are the machines to give their target items now.
	HandOuts []handOut
	// Release are the workers back to Ready whose Nodes the rollout
	// cordoned: they are uncordoned now.
	Release []rolloutMachine
	// Done is true when the stage has nothing left to do for the cluster.
	Done bool
	// Waiting says what the stage waits for, failures first.
	Waiting []string
}

// planRollout decides the next step of a rollout stage for one cluster.
// The order is that of seed 003: prepare on every machine at once; then
// managers strictly one at a time; then workers, at most s.batch at a
// time counting every worker still at work on deploy items or cordoned
// for an upgrade, whoever started it. A stage limited to some machines
// starts no more than its limit.
func planRollout(c rolloutCluster, s rolloutSettings) rolloutStep {
	if c.Cluster == nil {
		return rolloutStep{Waiting: []string{"waiting for " + c.ref() + " to exist"}}
	}
	var step rolloutStep
	if s.phase == lcmv1.StatePhasePrepare {
		planPrepare(c, s, &step)
		return step
	}
	managersDone := true
	if s.covers(lcmv1.MachineTypeManager) {
		managersDone = planManagers(c, &step)
	}
	workersDone := true
	if s.covers(lcmv1.MachineTypeWorker) {
		if managersDone {
			workersDone = planWorkers(c, s, &step)
		} else {
			workersDone = false
			if n := len(ofType(c.Machines, lcmv1.MachineTypeWorker)); n > 0 {
				step.Waiting = append(step.Waiting, fmt.Sprintf("%d workers wait for the managers", n))
			}
		}
	}
	step.Done = managersDone && workersDone && len(step.Release) == 0 && len(step.HandOuts) == 0
	return step
}

// planPrepare hands the prepare items to every reported machine at once:
// fetching archives needs no order between machines.
func planPrepare(c rolloutCluster, s rolloutSettings, step *rolloutStep) {
	var done, total int
	var busy, unreported, failed []string
	for _, m := range c.Machines {
		if !s.covers(m.Spec.Type) {
			continue
		}
		total++
		target := targetItems(c.Cluster, m.LCMMachine, lcmv1.StatePhasePrepare)
		switch progressOf(m.LCMMachine, target, lcmv1.StatePhasePrepare) {
		case progressDone:
			done++
		case progressUnreported:
			unreported = append(unreported, m.Name)
		case progressOutdated:
			step.HandOuts = append(step.HandOuts, handOut{Machine: m, Items: target})
			busy = append(busy, m.Name)
		case progressBusy:
			if failing(m.LCMMachine) {
				failed = append(failed, describeWork(m.LCMMachine))
			} else {
				busy = append(busy, describeWork(m.LCMMachine))
			}
		}
	}
	step.Done = done == total
	if step.Done {
		return
	}
	step.Waiting = append(step.Waiting, failed...)
	msg := fmt.Sprintf("%s: %d/%d machines prepared", c.ref(), done, total)
	if len(busy) > 0 {
		msg += fmt.Sprintf(", %d preparing (%s)", len(busy), sample(busy))
	}
	if len(unreported) > 0 {
		msg += fmt.Sprintf(", %d not reported by their agent yet (%s)", len(unreported), sample(unreported))
	}
	step.Waiting = append(step.Waiting, msg)
}

// planManagers hands the deploy items to one manager at a time: the first
// manager makes the cluster, the others join it one by one. It reports
// whether every manager is done.
func planManagers(c rolloutCluster, step *rolloutStep) bool {
	managers := ofType(c.Machines, lcmv1.MachineTypeManager)
	var done int
	var atWork []rolloutMachine
	var next *rolloutMachine
	var unreported []string
	for i, m := range managers {
		target := targetItems(c.Cluster, m.LCMMachine, lcmv1.StatePhaseDeploy)
		p := progressOf(m.LCMMachine, target, lcmv1.StatePhaseDeploy)
		switch {
		case p == progressDone:
			done++
		case p == progressBusy || disrupting(m.LCMMachine):
			// At work, on these items or older ones: it holds the one slot.
			atWork = append(atWork, m)
			if p == progressOutdated {
				step.HandOuts = append(step.HandOuts, handOut{Machine: m, Items: target})
			}
		case p == progressUnreported:
			unreported = append(unreported, m.Name)
		case next == nil:
			next = &managers[i]
		}
	}
	if done == len(managers) {
		return true
	}
	msg := fmt.Sprintf("%s: %d/%d managers Ready, one at a time", c.ref(), done, len(managers))
	for _, m := range atWork {
		msg += "; " + describeWork(m.LCMMachine)
	}
	if len(atWork) == 0 && next != nil {
		step.HandOuts = append(step.HandOuts, handOut{Machine: *next, Items: targetItems(c.Cluster, next.LCMMachine, lcmv1.StatePhaseDeploy)})
		msg += "; starting " + next.Name
	}
	if len(unreported) > 0 {
		msg += fmt.Sprintf("; %d not reported by their agent yet (%s)", len(unreported), sample(unreported))
	}
	step.Waiting = append(step.Waiting, msg)
	return false
}

// planWorkers hands the deploy items to workers in a sliding window of at
// most s.batch machines at work, the ones already at work first. It
// reports whether the stage is done with the workers.
func planWorkers(c rolloutCluster, s rolloutSettings, step *rolloutStep) bool {
	workers := ofType(c.Machines, lcmv1.MachineTypeWorker)
	var done int
	var atWork, waiting []rolloutMachine
	var unreported, failed []string
	for _, m := range workers {
		target := targetItems(c.Cluster, m.LCMMachine, lcmv1.StatePhaseDeploy)
		p := progressOf(m.LCMMachine, target, lcmv1.StatePhaseDeploy)
		switch {
		case p == progressDone:
			done++
			if m.DrainMark != "" {
				step.Release = append(step.Release, m)
			}
		case p == progressBusy || disrupting(m.LCMMachine) || m.DrainMark != "":
			atWork = append(atWork, m)
			if p == progressOutdated {
				step.HandOuts = append(step.HandOuts, workerHandOut(m, target))
			}
			if failing(m.LCMMachine) {
				failed = append(failed, describeWork(m.LCMMachine))
			}
		case p == progressUnreported:
			unreported = append(unreported, m.Name)
		default:
			waiting = append(waiting, m)
		}
	}
	if s.limit > 0 && done >= s.limit {
		return true
	}
	free := s.batch - len(atWork)
	if s.limit > 0 {
		free = min(free, s.limit-done-len(atWork))
	}
	started := 0
	for _, m := range waiting {
		if started >= free {
			break
		}
		target := targetItems(c.Cluster, m.LCMMachine, lcmv1.StatePhaseDeploy)
		step.HandOuts = append(step.HandOuts, workerHandOut(m, target))
		atWork = append(atWork, m)
		started++
	}
	if done == len(workers) {
		return true
	}
	want := len(workers)
	if s.limit > 0 {
		want = min(s.limit, len(workers))
	}
	step.Waiting = append(step.Waiting, failed...)
	msg := fmt.Sprintf("%s: %d/%d workers Ready, %d at work (at most %d at once)", c.ref(), done, want, len(atWork), s.batch)
	if left := len(waiting) - started; left > 0 && s.limit == 0 {
		msg += fmt.Sprintf(", %d waiting for a slot", left)
	}
	if started > 0 {
		msg += fmt.Sprintf("; starting %d", started)
	}
	if len(atWork) > started {
		m := atWork[0]
		if m.DrainMark != "" && !sameItems(m.Spec.StateItems, targetItems(c.Cluster, m.LCMMachine, lcmv1.StatePhaseDeploy)) {
			msg += "; " + m.Name + " cordoned for its upgrade, draining"
		} else {
			msg += "; " + describeWork(m.LCMMachine)
		}
	}
	if len(unreported) > 0 {
		msg += fmt.Sprintf("; %d not reported by their agent yet (%s)", len(unreported), sample(unreported))
	}
	step.Waiting = append(step.Waiting, msg)
	return false
}

// workerHandOut hands target to a worker, through a drain of its Node
// when that upgrades a worker with workloads. A worker without a Node has
// nothing to drain.
func workerHandOut(m rolloutMachine, target []lcmv1.StateItem) handOut {
	return handOut{Machine: m, Items: target, Drain: m.NodeFound && needsDrain(m.LCMMachine, target)}
}

func ofType(machines []rolloutMachine, t lcmv1.MachineType) []rolloutMachine {
	var out []rolloutMachine
	for _, m := range machines {
		if m.Spec.Type == t {
			out = append(out, m)
		}
	}
	return out
}

// sample names the first few of a list, for a message that stays short.
func sample(names []string) string {
	const shown = 3
	if len(names) <= shown {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:shown], ", "), len(names)-shown)
}

package metrics

import (
	"time"

	"github.com/fluxcd/pkg/ssa"
	"github.com/prometheus/client_golang/prometheus"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// RecordStages sets the stage families from the deployment's status: the
// state of every stage, its start time and its stuck flag. Stages that left
// the plan lose their series.
func (c *Collector) RecordStages(cd *capstanv1.ClusterDeployment) {
	c.recordStages(cd, false)
}

func (c *Collector) recordStages(cd *capstanv1.ClusterDeployment, suspended bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.entry(cd)
	seen := make(map[string]bool, len(cd.Status.Stages))
	for _, st := range cd.Status.Stages {
		seen[st.Name] = true
		for _, s := range States {
			c.stageState.WithLabelValues(cd.Namespace, cd.Name, st.Name, string(s)).Set(b2f(st.State == s))
		}
		if st.StartedAt != nil && st.State != capstanv1.StagePending {
			c.stageStarted.WithLabelValues(cd.Namespace, cd.Name, st.Name).Set(float64(st.StartedAt.UnixMilli()) / 1000)
		} else {
			c.stageStarted.DeleteLabelValues(cd.Namespace, cd.Name, st.Name)
		}
		stuck := st.Stuck && st.State != capstanv1.StageReady && !suspended
		c.stageStuck.WithLabelValues(cd.Namespace, cd.Name, st.Name).Set(b2f(stuck))
	}
	left := false
	for name := range d.stages {
		if !seen[name] {
			c.deleteStage(cd.Namespace, cd.Name, name)
			c.stageUsers[name]--
			left = true
		}
	}
	for name := range seen {
		if !d.stages[name] {
			c.stageUsers[name]++
		}
	}
	d.stages = seen
	if left {
		c.dropUnusedStageNames()
	}
	if p := cd.Status.Pivot; p != nil && p.Phase != "" {
		for _, phase := range capstanv1.PivotPhases {
			c.pivotState.WithLabelValues(cd.Namespace, cd.Name, string(phase)).Set(b2f(phase == p.Phase))
		}
	} else {
		c.pivotState.DeletePartialMatch(map[string]string{labelNamespace: cd.Namespace, labelName: cd.Name})
	}
}

func (c *Collector) deleteStage(namespace, name, stage string) {
	for _, s := range States {
		c.stageState.DeleteLabelValues(namespace, name, stage, string(s))
	}
	c.stageStarted.DeleteLabelValues(namespace, name, stage)
	c.stageStuck.DeleteLabelValues(namespace, name, stage)
}

// ObserveStageEnd records how long a stage ran until it became Ready or
// until an attempt at it failed. A stage still waiting has not ended.
func (c *Collector) ObserveStageEnd(stage string, result StageResult, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended[stage] = true
	c.stageDuration.WithLabelValues(stage, string(result)).Observe(d.Seconds())
}

// dropUnusedStageNames deletes the stage_duration_seconds series of every
// stage name no known deployment has in its status any more; c.mu is
// held. A stage that ends before its first status write names it (rare:
// the status says InProgress first) loses its observation if another
// deployment drops a stage in between, which keeps the rule simple: the
// histogram of a name lives as long as some deployment uses the name.
func (c *Collector) dropUnusedStageNames() {
	for name := range c.ended {
		if c.stageUsers[name] > 0 {
			continue
		}
		c.stageDuration.DeletePartialMatch(prometheus.Labels{"stage": name})
		delete(c.ended, name)
	}
	for name, n := range c.stageUsers {
		if n <= 0 {
			delete(c.stageUsers, name)
		}
	}
}

// ObserveReconcile records one reconcile of the deployment. Only
// OutcomeError and OutcomeStalled count as failures.
func (c *Collector) ObserveReconcile(cd *capstanv1.ClusterDeployment, d time.Duration, outcome Outcome) {
	c.reconcileDuration.WithLabelValues(string(outcome)).Observe(d.Seconds())
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entry(cd)
	if outcome == OutcomeSuccess {
		e.failures = 0
	} else {
		e.failures++
	}
	c.failures.WithLabelValues(cd.Namespace, cd.Name).Set(float64(e.failures))
}

// ObserveSource records one request to the deployment's source. A source
// that never answered since the daemon started shows a last success of 0,
// so that an alert on its age fires.
func (c *Collector) ObserveSource(cd *capstanv1.ClusterDeployment, o SourceObservation) {
	result := "success"
	if o.Err != nil {
		result = "error"
	}
	c.sourceDuration.WithLabelValues(string(o.Operation), result).Observe(o.Duration.Seconds())
	if o.Interval > 0 {
		c.sourceInterval.WithLabelValues(cd.Namespace, cd.Name).Set(o.Interval.Seconds())
	}
	success := c.sourceSuccess.WithLabelValues(cd.Namespace, cd.Name)
	if o.Err != nil {
		// Touch the series without moving it: 0 when it is new.
		success.Add(0)
		return
	}
	success.Set(float64(c.now().UnixMilli()) / 1000)
	if o.Revision == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entry(cd)
	if e.revision != o.Revision {
		if e.revision != "" {
			c.revisionInfo.DeleteLabelValues(cd.Namespace, cd.Name, e.revision)
		}
		e.revision = o.Revision
	}
	c.revisionInfo.WithLabelValues(cd.Namespace, cd.Name, o.Revision).Set(1)
}

// CountApply counts the objects of a stage's change set by what the apply
// did to them.
func (c *Collector) CountApply(cd *capstanv1.ClusterDeployment, cs *ssa.ChangeSet) {
	if cs == nil {
		return
	}
	for _, e := range cs.Entries {
		c.applyObjects.WithLabelValues(cd.Namespace, cd.Name, string(e.Action)).Inc()
	}
}

// RecordSuspended records a suspended deployment: its stages as its status
// left them, but nothing that alerts, since nobody works on it until it is
// resumed: no stage stuck, no failures, and no source freshness (it polls
// nothing, so its source would look stale).
func (c *Collector) RecordSuspended(cd *capstanv1.ClusterDeployment) {
	c.recordStages(cd, true)
	labels := map[string]string{labelNamespace: cd.Namespace, labelName: cd.Name}
	c.sourceSuccess.DeletePartialMatch(labels)
	c.sourceInterval.DeletePartialMatch(labels)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entry(cd).failures = 0
	c.failures.DeletePartialMatch(labels)
}

// Forget deletes every series of a ClusterDeployment, once it is deleted,
// and the stage_duration_seconds series of the stage names no other
// deployment has. The other histograms are kept: they aggregate over
// deployments and have no label a deployment chooses.
func (c *Collector) Forget(namespace, name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	labels := map[string]string{labelNamespace: namespace, labelName: name}
	for _, vec := range c.perDeployment() {
		vec.DeletePartialMatch(labels)
	}
	if d, ok := c.deployments[key{namespace, name}]; ok {
		for stage := range d.stages {
			c.stageUsers[stage]--
		}
	}
	delete(c.deployments, key{namespace, name})
	c.dropUnusedStageNames()
}

// Drift actions.
const (
	DriftCorrected = "corrected"
	DriftReported  = "reported"
)

// CountDrift counts one drifted object of the deployment and what was done
// about it (DriftCorrected, DriftReported).
func (c *Collector) CountDrift(cd *capstanv1.ClusterDeployment, action string) {
	c.drift.WithLabelValues(cd.Namespace, cd.Name, action).Inc()
}

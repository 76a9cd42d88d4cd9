// Package metrics turns what the reconciler observed into Prometheus
// metrics: the state, start time, duration and stuck flag of every stage,
// how reconciles and source requests went, and what applies changed.
//
// It holds no judgement of its own. The reconciler calls it with the
// ClusterDeployment status it just wrote (RecordStages) and with the
// outcome of each step (ObserveReconcile, ObserveSource, ObserveStageEnd,
// CountApply); Forget drops every series of a deleted ClusterDeployment,
// so that the number of series follows the number of deployments.
//
// Waiting for readiness is not a failure: a reconcile whose stage is still
// in progress counts as a success and resets the consecutive-failures gauge.
// docs/metrics.md lists every family with its labels and the series bound.
package metrics

// Package reconciler is the loop that drives each ClusterDeployment:
// ask the source for its revision, fetch and render only when something
// changed, build the plan, and walk its stages with the stages.Executor.
// It is the one place that turns what the other packages return into
// effects: ClusterDeployment status, Kubernetes events, logs and Prometheus
// metrics (reconciler/metrics; later also git commits and pull-request
// comments). An attempt that ends on an error ends in conclude
// (outcome.go), which reads the error's reason and policy (package
// failure) and sets the conditions, the event, the metrics outcome and the
// requeue from them.
//
// Daemon wires the loop into a controller-runtime manager together with the
// root source, which applies every ClusterDeployment committed under a path
// of one repository, so that adding a cluster is a git push.
package reconciler

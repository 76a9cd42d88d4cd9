// Package stages turns rendered objects into an ordered plan and carries out
// one stage of it at a time.
//
// BuildPlan assigns every rendered object to exactly one stage (by the
// `capstan.dev/stage` label or annotation, else by the first stage whose
// selector matches) and refuses a plan that leaves an object out. The
// Executor runs a single stage: it applies the stage's objects with
// server-side apply (fluxcd/pkg/ssa) from a bounded pool of workers, then
// waits on watch events, not on a polling timer, until the stage's readiness
// checks hold or the context's deadline passes. It returns what it did as a
// Result; it never writes status. A failed Result carries a failure.Error
// (a reason such as ObjectInvalid or ApplyFailed, and a policy: retry,
// wait or stalled); the reconciler decides what it means for status,
// events and metrics, and when to try again.
//
// The Executor acts on one Cluster, a connection to one cluster: the one
// Capstan runs in, or another reached through a kubeconfig (Executor.On).
// A remote cluster that cannot be reached is waited for, not failed
// (UnreachableError).
package stages

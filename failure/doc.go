// Package failure is Capstan's one error vocabulary. Every failure that a
// source, render or a stage reports carries a reason (a CamelCase word for
// conditions, events and docs/troubleshooting.md) and a policy that says
// what may heal it:
//
//   - Retry: transient (a network error, a server that answered 5xx);
//     the same attempt may succeed later, after a backoff that counts
//     failed attempts only.
//   - Wait: not a failure at all; something else must happen first (a
//     dependency becomes Ready, a cluster answers again). It is not
//     counted in failure metrics or alerts.
//   - Stalled: retrying cannot help until a person changes the input
//     (the source, the spec, the cluster's RBAC); the deployment is
//     reported Stalled and is not hot-looped on.
//
// The reconciler alone turns an Error into conditions, events, metrics and
// the next requeue, in one function. The package imports nothing of
// Capstan, so that sources, render and stages can all use it without
// importing each other (the dependency rule of docs/architecture.md).
package failure

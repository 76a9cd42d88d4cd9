// Package report writes a deployment's progress back where people look,
// outside the cluster. It holds the status commits of issue #14: every
// status the reconciler writes is handed to a Reporter (Notify), which
// renders it as the file status/<namespace>/<name>.yaml and commits it to
// a status branch (default capstan/status) of the deployment's repository,
// at most once per deployment per coalescing window, batching the
// deployments of one repository into one commit.
//
// The status branch is never a branch Capstan reads, so a status commit
// cannot trigger a reconcile of itself. A push that loses a race is
// retried on top of the new tip, re-applying only the status files. Values
// of the Secrets a deployment uses never reach a commit. A failing push is
// logged, counted (capstan_report_commits_total) and retried with backoff;
// it never holds up reconciling. docs/report.md describes the behaviour.
package report

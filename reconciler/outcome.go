package reconciler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/stages"
)

// Reasons the reconciler gives the failures of its own steps; sources,
// render and stages give theirs (docs/troubleshooting.md lists them all).
const (
	// ReasonReconcileFailed is the reason of an error that carries none:
	// an API request of the reconciler that failed. It is retried.
	ReasonReconcileFailed = "ReconcileFailed"
	// ReasonPlanInvalid: the stages of spec (or its profile) cannot be
	// built into a plan over the rendered objects.
	ReasonPlanInvalid = "PlanInvalid"
	// ReasonBootstrapKeyUnused: the plan hands a bootstrap SSH key to the
	// cluster and no object carries it.
	ReasonBootstrapKeyUnused = "BootstrapKeyUnused"
	// ReasonDependencyNotReady: a deployment of spec.dependsOn is not
	// Ready at its current revision and generation.
	ReasonDependencyNotReady = "DependencyNotReady"
	// ReasonDependencyCycle: spec.dependsOn leads back to the deployment.
	ReasonDependencyCycle = "DependencyCycle"
	// ReasonSecretNotReadable: a Secret spec.source names cannot be read.
	// Like every reason of a source failure, it starts with "Source".
	ReasonSecretNotReadable = "SourceSecretNotReadable"
)

// Reasons of the conditions the walk writes while nothing failed.
const (
	// ReasonProgressing: a revision is being walked (Ready=False,
	// Reconciling=True, Stalled=False).
	ReasonProgressing = "Progressing"
	// ReasonSucceeded: every stage is Ready at the revision (Ready=True,
	// Reconciling=False), or the source answered (SourceReady=True).
	ReasonSucceeded = "Succeeded"
	// ReasonPruning: every stage is Ready and what the revision dropped
	// is being deleted.
	ReasonPruning = "Pruning"
	// ReasonDeleting: the deployment is being deleted and waits for what
	// it applied to go.
	ReasonDeleting = "Deleting"
	// ReasonSourceReady: Stalled=False once the source answers again.
	ReasonSourceReady = capstanv1.ConditionSourceReady
)

// conclude is the one place that turns the error ending an attempt into
// what the deployment shows and when it is looked at again: its
// conditions, an event, the outcome its metrics record, and the requeue.
// The error's reason and policy (failure.Error) decide:
//
//   - a source failure (checking or fetching) sets SourceReady=False and
//     leaves Ready as it was, since what was applied still stands; it is
//     tried again after a backoff capped by the poll interval, so a
//     source that comes back is seen within one interval;
//   - Wait is not a failure: Ready=False says what is awaited, the outcome
//     is a success, and the deployment is looked at again when the error
//     says (RetryAfter) or after a short backoff;
//   - Retry: Ready=False, Reconciling=True, exponential backoff on the
//     failed attempts in a row;
//   - Stalled: Ready=False, Stalled=True; the deployment is not tried
//     again at this revision and generation, unless the error says when
//     to look again (a fix outside the input, such as RBAC).
//
// A stage that failed or waits for its cluster was recorded by the walk
// already (its status, Ready with the error's reason, a StageFailed
// event): conclude leaves Ready as the walk wrote it.
func (r *Reconciler) conclude(ctx context.Context, a *attempt, err error) (reconcile.Result, error) {
	cd := a.cd
	f, requeue := r.settle(a, err)
	msg := err.Error()
	logger := log.FromContext(ctx)
	if perr := r.saveStatus(ctx, a); perr != nil {
		logger.Error(perr, "record the attempt's end in status")
	}
	if f.Policy == failure.PolicyWait {
		logger.Info("waiting", "reason", f.Reason, "message", msg, "retryIn", requeue)
	} else {
		logger.Error(err, "reconcile failed", "reason", f.Reason, "policy", f.Policy, "revision", a.revision, "retryIn", requeue)
		if !a.stageRecorded {
			// A failed stage had its StageFailed event from the walk.
			r.event(cd, "Warning", f.Reason, "%s", msg)
		}
	}
	return reconcile.Result{RequeueAfter: requeue}, nil
}

// settle is conclude's judgement, apart from its writes: it sets a's
// conditions and outcome from err and returns err's reason and policy and
// when to look again.
func (r *Reconciler) settle(a *attempt, err error) (failure.Error, time.Duration) {
	f := describe(err)
	msg := err.Error()
	switch {
	case a.sourceFailed:
		return f, r.concludeSource(a, f, msg)
	case a.stageRecorded && f.Policy == failure.PolicyWait:
		// The walk said what the stage waits for; every attempt while it
		// waits finds the same status, which costs no write.
		return f, r.waitAgain(a, f)
	case f.Policy == failure.PolicyWait:
		return f, r.concludeWait(a, f, msg)
	case f.Policy == failure.PolicyStalled:
		return f, r.concludeStalled(a, f, msg)
	default:
		return f, r.concludeRetry(a, f, msg)
	}
}

// describe returns err's reason and policy, with the defaults of an error
// that carries none: retried, reason ReconcileFailed.
func describe(err error) failure.Error {
	out := failure.Error{Reason: ReasonReconcileFailed, Policy: failure.PolicyRetry, Err: err}
	if f, ok := failure.From(err); ok {
		out.Policy, out.RetryAfter = failure.PolicyOf(err), f.RetryAfter
		out.Reason = failure.ReasonOf(err, ReasonReconcileFailed)
	}
	return out
}

// concludeSource records a source that could not be read. The status
// keeps its revision and stages: they say what is applied, which the
// outage does not change.
func (r *Reconciler) concludeSource(a *attempt, f failure.Error, msg string) time.Duration {
	cd := a.cd
	prev := meta.FindStatusCondition(cd.Status.Conditions, capstanv1.ConditionSourceReady)
	fromSource := func(typ string) bool {
		c := meta.FindStatusCondition(cd.Status.Conditions, typ)
		return c != nil && prev != nil && prev.Status == "False" && c.Reason == prev.Reason
	}
	if ready := meta.FindStatusCondition(cd.Status.Conditions, capstanv1.ConditionReady); ready == nil || fromSource(capstanv1.ConditionReady) {
		// Nothing was applied yet (or only the source ever failed): Ready
		// says why nothing is, and Reconciling whether it is retried.
		setCondition(cd, capstanv1.ConditionReady, false, f.Reason, msg)
		setCondition(cd, capstanv1.ConditionReconciling, f.Policy != failure.PolicyStalled, f.Reason, msg)
	}
	switch {
	case f.Policy == failure.PolicyStalled:
		setCondition(cd, capstanv1.ConditionStalled, true, f.Reason, msg)
		a.outcome = metrics.OutcomeStalled
	case fromSource(capstanv1.ConditionStalled):
		setCondition(cd, capstanv1.ConditionStalled, false, retryingReason, "")
		a.outcome = metrics.OutcomeError
	default:
		a.outcome = metrics.OutcomeError
	}
	setCondition(cd, capstanv1.ConditionSourceReady, false, f.Reason, msg)
	if f.Policy == failure.PolicyStalled {
		return interval(cd)
	}
	// Backoff on the failures in a row, but never past the interval: the
	// source is polled at least that often when it works.
	return min(r.backoff(r.failures.inc(client.ObjectKeyFromObject(cd))), interval(cd))
}

// retryingReason is the Stalled condition's reason while failed attempts
// are retried (`capstan status` shows them as Retrying).
const retryingReason = "Retrying"

func (r *Reconciler) concludeWait(a *attempt, f failure.Error, msg string) time.Duration {
	cd := a.cd
	setCondition(cd, capstanv1.ConditionReady, false, f.Reason, msg)
	setCondition(cd, capstanv1.ConditionReconciling, true, f.Reason, msg)
	setCondition(cd, capstanv1.ConditionStalled, false, f.Reason, "")
	return r.waitAgain(a, f)
}

// waitAgain is when to look again at what a wait waits for: when the
// error says, or, waiting for a cluster, after a backoff short enough
// that its return does not go unnoticed for long. These are not failures:
// they have a counter of their own.
func (r *Reconciler) waitAgain(a *attempt, f failure.Error) time.Duration {
	if f.RetryAfter > 0 {
		return f.RetryAfter
	}
	return min(r.backoff(r.unreachable.inc(client.ObjectKeyFromObject(a.cd))), unreachableRetryMax)
}

func (r *Reconciler) concludeRetry(a *attempt, f failure.Error, msg string) time.Duration {
	cd := a.cd
	a.outcome = metrics.OutcomeError
	if !a.stageRecorded {
		setCondition(cd, capstanv1.ConditionReady, false, f.Reason, msg)
	}
	setCondition(cd, capstanv1.ConditionStalled, false, retryingReason, "")
	setCondition(cd, capstanv1.ConditionReconciling, true, f.Reason, msg)
	d := r.backoff(r.failures.inc(client.ObjectKeyFromObject(cd)))
	if f.RetryAfter > 0 {
		d = max(d, f.RetryAfter)
	}
	return d
}

// concludeStalled records a failure only a change can heal. The revision
// and generation it failed at are recorded, so that a poll finding the
// same input does nothing; should they differ from those the stages were
// walked at, the stages start over at Pending, since what they say belongs
// to another input.
func (r *Reconciler) concludeStalled(a *attempt, f failure.Error, msg string) time.Duration {
	cd := a.cd
	a.outcome = metrics.OutcomeStalled
	key := client.ObjectKeyFromObject(cd)
	if a.revision != "" && !sameWalk(cd, a.revision) {
		restartStages(cd, a.revision)
	}
	cd.Status.ObservedGeneration = cd.Generation
	if !a.stageRecorded {
		setCondition(cd, capstanv1.ConditionReady, false, f.Reason, msg)
	}
	setCondition(cd, capstanv1.ConditionStalled, true, f.Reason, msg)
	setCondition(cd, capstanv1.ConditionReconciling, false, f.Reason, msg)
	if f.RetryAfter > 0 {
		// The fix lies outside the input (a permission): look again.
		r.stalls.forget(key)
		return min(f.RetryAfter, interval(cd))
	}
	r.stalls.remember(key, cd.Status.Revision, cd.Generation)
	return interval(cd)
}

// stageError is the error a failed attempt at stage ends the walk with,
// naming the stage once.
func stageError(stage string, res stages.Result) error {
	err := res.Err
	if err == nil {
		err = errors.New(res.Message)
	}
	if strings.HasPrefix(err.Error(), "stage "+stage+":") {
		return err
	}
	return fmt.Errorf("stage %s: %w", stage, err)
}

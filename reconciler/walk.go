package reconciler

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/stages"
)

// walkStages runs the plan from its first stage that is not Ready at this
// revision and generation. Stages already Ready pass at once, which makes a
// restarted daemon resume where the last one stopped. The walk stops at the
// first stage that is not Ready after its attempt: nothing of a later stage
// is applied before it.
func (r *Reconciler) walkStages(ctx context.Context, a *attempt) (bool, error) {
	cd := a.cd
	// Some changes wait for the next write rather than cost one of their
	// own: the preflight's verdict, the reset of a new walk, a stage found
	// Ready before the next one starts. save writes what waits
	// (saveStatus).
	save := func() error {
		if err := r.saveStatus(ctx, a); err != nil {
			return err
		}
		// Watch what the walk applied so far, as status records it: an
		// object of an earlier stage edited while a later one waits (for
		// minutes, with machines) is noted then, and corrected once the
		// deployment is Ready (correctFromPlan). Started only at Ready,
		// the watch would list the edited object as it is and see no
		// change. An unchanged inventory costs nothing here.
		r.drift.track(cd)
		return nil
	}
	r.resetStagesIfNew(cd, a)
	setCondition(cd, capstanv1.ConditionStalled, false, ReasonProgressing, "")
	// A stage Ready as soon as it is applied (it never waited) has one
	// event, not a start and an end; when the deployment becomes Ready in
	// the same walk, the Ready event tells it. A stage that waits
	// announces its start when status says it waits. Events are API
	// writes: a fleet of one-stage deployments sent three each.
	var quick []string // StageReady events held back, in stage order
	flush := func() {
		for _, msg := range quick {
			r.event(cd, "Normal", "StageReady", "%s", msg)
		}
		quick = nil
	}
	defer flush()

	for i := range a.plan.Stages {
		stage := &a.plan.Stages[i]
		// Look the stage's status up afresh after every patch: a patch
		// decodes the server's answer into cd, which may replace the slice.
		st := func() *capstanv1.StageStatus { return &cd.Status.Stages[i] }
		if st().State == capstanv1.StageReady {
			continue
		}
		if stuck, err := r.hardTimeout(stage, st()); stuck {
			if serr := save(); serr != nil {
				return false, serr
			}
			return false, err
		}
		applied := st().State == capstanv1.StageInProgress && st().AppliedAt != nil
		r.startAttempt(cd, st(), stage)
		if err := save(); err != nil {
			return false, err
		}
		// A stage announces its start once it has to wait (its apply
		// went through and it is not Ready yet) or fails; one applied by
		// an earlier attempt did then.
		announced := applied
		announce := func() {
			if !announced {
				announced = true
				flush()
				r.event(cd, "Normal", "StageInProgress", "stage %s started at %s (%d objects)", st().Name, a.revision, st().Objects)
			}
		}

		exec, err := r.executorFor(ctx, cd, stage, a.plan)
		var res stages.Result
		switch {
		case stages.IsUnreachable(err):
			res = stages.Unreachable(stage.Name, err)
		case err != nil:
			res = stages.Result{Stage: stage.Name, State: capstanv1.StageFailed, Err: err, Message: err.Error()}
		default:
			res, err = r.runStage(ctx, a, exec, i, applied, save, announce)
			if err != nil {
				return false, err
			}
		}
		r.recordResult(cd, st(), stage, res)
		moved := res.Moved
		// A Ready stage is written with the next one's start, or the last
		// one with the deployment's Ready below.
		if res.State != capstanv1.StageReady || moved {
			if err := save(); err != nil {
				return false, err
			}
		}
		switch res.State {
		case capstanv1.StageReady:
			r.unreachable.reset(client.ObjectKeyFromObject(cd))
			r.failures.reset(client.ObjectKeyFromObject(cd))
			took := st().FinishedAt.Sub(st().StartedAt.Time).Round(time.Millisecond)
			r.metrics.ObserveStageEnd(st().Name, metrics.StageResultReady, st().FinishedAt.Sub(st().StartedAt.Time))
			if announced || moved {
				flush()
				r.event(cd, "Normal", "StageReady", "stage %s ready after %s", st().Name, took)
			} else {
				quick = append(quick, fmt.Sprintf("stage %s started at %s (%d objects) and was ready after %s", st().Name, a.revision, st().Objects, took))
			}
			if moved {
				// The deployment lives in the target now; here it is a
				// suspended mirror, and the stages after this one are the
				// target's Capstan's to run.
				r.event(cd, "Normal", "Pivoted", "stage %s: %s; the stages after it run there", st().Name, res.Message)
				// From now on the deployment here is a mirror: refresh it
				// at once, then every MirrorInterval.
				a.requeue = time.Second
				return true, nil
			}
			continue
		case capstanv1.StageFailed:
			announce()
			r.metrics.ObserveStageEnd(st().Name, metrics.StageResultFailed, r.opts.Now().Sub(st().StartedAt.Time))
			r.event(cd, "Warning", "StageFailed", "stage %s attempt %d failed: %s", st().Name, st().Attempts, res.Message)
			// conclude decides by the error's policy: retried with backoff
			// on the failures in a row, or stalled.
			a.stageRecorded = true
			return false, failure.Default(stageError(st().Name, res), stages.ReasonStageFailed, failure.PolicyRetry)
		case capstanv1.StageInProgress:
			announce()
			if stages.IsUnreachable(res.Err) {
				// Waiting for the cluster, not failing (conclude).
				a.stageRecorded = true
				return false, res.Err
			}
			// Not ready yet: the wait slice already waited on watch events,
			// so come back soon rather than after the poll interval.
			a.requeue = time.Second
		}
		r.unreachable.reset(client.ObjectKeyFromObject(cd))
		return true, nil
	}

	// Every stage is Ready: what the revision no longer applies goes now.
	// With nothing to prune, the last stage's Ready and the deployment's
	// go in one write (each write sends the whole status, inventory
	// included, through the API server).
	if mayPrune(cd, a.plan) {
		if err := save(); err != nil {
			return false, err
		}
		// The prune's deletes are a batch of API requests: bounded by
		// spec.timeout, like the stages' (docs/deadlines.md).
		pctx, cancel := context.WithTimeout(ctx, cd.Spec.TimeoutOrDefault())
		done, err := r.prune(pctx, a)
		cancel()
		if err != nil || !done {
			return !done, err
		}
	}
	before := a.written
	cd.Status.CurrentStage = ""
	ready := fmt.Sprintf("all %d stages ready at %s", len(a.plan.Stages), a.revision)
	if inv := cd.Status.Inventory; inv != nil && len(inv.PendingPrune) > 0 {
		ready += fmt.Sprintf("; %d objects the source dropped wait to be pruned (status.inventory.pendingPrune): set spec.prune.destructive to delete them", len(inv.PendingPrune))
	}
	setCondition(cd, capstanv1.ConditionReady, true, ReasonSucceeded, ready)
	setCondition(cd, capstanv1.ConditionReconciling, false, ReasonSucceeded, "")
	if err := r.saveStatus(ctx, a); err != nil {
		return false, err
	}
	r.failures.reset(client.ObjectKeyFromObject(cd))
	// Watch what is applied now; correct what drifted meanwhile. The plan
	// is not needed again at this revision.
	r.plans.drop(client.ObjectKeyFromObject(cd))
	r.drift.track(cd)
	cctx, cancel := context.WithTimeout(ctx, cd.Spec.TimeoutOrDefault())
	defer cancel()
	if err := r.correctFromPlan(cctx, a); err != nil {
		return false, err
	}
	if !conditionTrue(before, capstanv1.ConditionReady) {
		msg := fmt.Sprintf("all %d stages ready at %s", len(a.plan.Stages), a.revision)
		if len(quick) > 0 {
			msg += "; " + strings.Join(quick, "; ")
			quick = nil
		}
		r.event(cd, "Normal", "Ready", "%s", msg)
	}
	log.FromContext(ctx).Info("deployment ready", "revision", a.revision)
	return true, nil
}

// mayPrune reports whether prune has something to do for cd at plan:
// inventory entries the plan no longer applies, or ones held back.
func mayPrune(cd *capstanv1.ClusterDeployment, plan *stages.Plan) bool {
	inv := cd.Status.Inventory
	return inv != nil && (len(inv.PendingPrune) > 0 || len(stages.Stale(inv, plan)) > 0)
}

// runStage makes one attempt at the i-th stage of a's plan through the
// executor: it applies (unless applied says the objects were applied at
// this revision already), then waits for a slice. What the attempt did so
// far reaches status while it runs: the apply at once (with the inventory
// and the apply metrics), then, when status says nothing yet of what the
// stage waits for, the first look, each written by save. The result is the
// attempt's last word, for the caller to record.
func (r *Reconciler) runStage(ctx context.Context, a *attempt, exec *stages.Executor, i int, applied bool, save func() error, announce func()) (stages.Result, error) {
	cd := a.cd
	stage := &a.plan.Stages[i]
	st := func() *capstanv1.StageStatus { return &cd.Status.Stages[i] }
	// spec.timeout bounds each batch of API requests of the attempt (an
	// apply wave, its look and dry runs), not the stage's wait: a stage
	// waits as long as it must.
	opts := stages.RunOptions{SkipApply: applied, Wait: r.waitSlice(stage, st()), DryRuns: a.plan.DryRuns,
		BatchTimeout: cd.Spec.TimeoutOrDefault()}
	if st().Message == "" || !applied {
		// Status says nothing yet about what the stage waits for: look
		// briefly first and say it, then wait out the slice.
		opts.FirstLook = min(opts.Wait, firstLook)
	}
	var (
		progressErr error
		reported    bool // the apply went through Progress
	)
	countApply := func(res stages.Result) {
		if res.ChangeSet != nil {
			r.metrics.CountApply(cd, res.ChangeSet)
		}
		if res.Applied {
			recordInventory(cd, exec, stage, a.plan)
		}
	}
	opts.Progress = func(res stages.Result) error {
		if res.Applied {
			reported = true
			countApply(res)
		}
		r.recordResult(cd, st(), stage, res)
		progressErr = save()
		if progressErr == nil && res.State != capstanv1.StageReady {
			// Status says the stage waits: so does an event.
			announce()
		}
		return progressErr
	}
	res := exec.Run(ctx, stage, stages.Owner{Name: cd.Name, Namespace: cd.Namespace}, opts)
	if progressErr != nil {
		return res, progressErr
	}
	if reported {
		// Progress recorded the apply (its time, inventory, counts); the
		// caller records where the wait left the stage.
		res.Applied, res.ChangeSet = false, nil
	} else {
		// The attempt ended with the apply (failed, or Ready in its
		// answers): the caller records it with the rest in one write.
		countApply(res)
	}
	return res, nil
}

// firstLook is how long an attempt waits before it writes what the stage
// waits for, when status does not say it yet (a stage just applied).
const firstLook = 2 * time.Second

// minWaitSlice is the shortest wait of an attempt that waitSlice cuts short.
const minWaitSlice = time.Second

// waitSlice is how long one attempt waits for a stage: the configured
// slice, cut short when the stage would pass its stuckAfter during it, so
// that status and the stuck metric flip on time rather than a slice late.
func (r *Reconciler) waitSlice(stage *stages.Stage, st *capstanv1.StageStatus) time.Duration {
	slice := r.opts.WaitSlice
	if stage.StuckAfter == nil || st.Stuck || st.StartedAt == nil {
		return slice
	}
	// A millisecond past the threshold, since stuck means strictly longer;
	// at least a second, so that the wait can list what it waits for.
	until := st.StartedAt.Add(stage.StuckAfter.Duration).Sub(r.opts.Now()) + time.Millisecond
	return min(slice, max(until, minWaitSlice))
}

// resetStagesIfNew starts a new walk when the revision or the spec changed:
// every stage goes back to Pending. Otherwise the recorded stages are kept
// (matched by name), so that progress survives restarts.
func (r *Reconciler) resetStagesIfNew(cd *capstanv1.ClusterDeployment, a *attempt) {
	same := sameWalk(cd, a.revision)
	old := map[string]capstanv1.StageStatus{}
	if same {
		for _, st := range cd.Status.Stages {
			old[st.Name] = st
		}
	}
	next := make([]capstanv1.StageStatus, len(a.plan.Stages))
	for i, stage := range a.plan.Stages {
		st, ok := old[stage.Name]
		if !ok {
			st = capstanv1.StageStatus{Name: stage.Name, State: capstanv1.StagePending, Revision: a.revision}
		}
		st.Objects = int32(len(stage.Objects))
		next[i] = st
	}
	cd.Status.Stages = next
	cd.Status.Revision = a.revision
	cd.Status.ObservedGeneration = cd.Generation
	if !same {
		setCondition(cd, capstanv1.ConditionReady, false, ReasonProgressing, "new revision "+a.revision)
		setCondition(cd, capstanv1.ConditionReconciling, true, ReasonProgressing, "new revision "+a.revision)
	}
}

// sameWalk reports whether cd's recorded stages belong to the walk of
// revision: same revision, same spec. The spec changes a move makes
// (suspend here, re-creation and resume in the target) are not changes of
// what to deploy: the stages stay.
func sameWalk(cd *capstanv1.ClusterDeployment, revision string) bool {
	return cd.Status.Revision == revision && (cd.Status.ObservedGeneration == cd.Generation || pivoting(cd) || arriving(cd))
}

func (r *Reconciler) startAttempt(cd *capstanv1.ClusterDeployment, st *capstanv1.StageStatus, stage *stages.Stage) {
	now := metav1.NewTime(r.opts.Now())
	if st.StartedAt == nil {
		st.StartedAt = &now
	}
	if st.State != capstanv1.StageInProgress {
		// A stage that starts, or starts over after a failure, makes a new
		// attempt; one that waits goes on with the attempt it is in, however
		// many wait slices that takes.
		st.State = capstanv1.StageInProgress
		st.Attempts++
	}
	cd.Status.CurrentStage = st.Name
	setCondition(cd, capstanv1.ConditionReconciling, true, ReasonProgressing, "stage "+st.Name)
	st.Stuck = stage.StuckAfter != nil && r.opts.Now().Sub(st.StartedAt.Time) > stage.StuckAfter.Duration
}

func (r *Reconciler) recordResult(cd *capstanv1.ClusterDeployment, st *capstanv1.StageStatus, stage *stages.Stage, res stages.Result) {
	st.Message = redact(res.Message)
	if res.Progress != nil {
		st.Progress = res.Progress
	}
	if res.Applied {
		now := metav1.NewTime(r.opts.Now())
		st.AppliedAt = &now
		st.Message = summarizeChanges(res)
	}
	switch res.State {
	case capstanv1.StageReady:
		now := metav1.NewTime(r.opts.Now())
		st.State = capstanv1.StageReady
		st.FinishedAt = &now
		st.Stuck = false
		st.Message = ""
	case capstanv1.StageFailed:
		st.State = capstanv1.StageFailed
		setCondition(cd, capstanv1.ConditionReady, false, failure.ReasonOf(res.Err, stages.ReasonStageFailed), fmt.Sprintf("stage %s: %s", st.Name, st.Message))
	default:
		st.State = capstanv1.StageInProgress
		st.Stuck = stage.StuckAfter != nil && r.opts.Now().Sub(st.StartedAt.Time) > stage.StuckAfter.Duration
		setCondition(cd, capstanv1.ConditionReady, false, failure.ReasonOf(res.Err, ReasonProgressing), fmt.Sprintf("stage %s: %s", st.Name, st.Message))
	}
}

// hardTimeout fails the deployment as stalled once a stage with a hard
// timeout has been in progress longer than it allows.
func (r *Reconciler) hardTimeout(stage *stages.Stage, st *capstanv1.StageStatus) (bool, error) {
	if stage.Timeout == nil || st.StartedAt == nil {
		return false, nil
	}
	if elapsed := r.opts.Now().Sub(st.StartedAt.Time); elapsed > stage.Timeout.Duration {
		return true, failure.Stalled(stages.ReasonStageTimedOut, fmt.Errorf("stage %s: not ready after %s, over its timeout of %s: %s",
			st.Name, elapsed.Round(time.Second), stage.Timeout.Duration, st.Message))
	}
	return false, nil
}

func summarizeChanges(res stages.Result) string {
	if res.ChangeSet == nil {
		// An action that applies nothing itself (a pivot) says what it did.
		return res.Message
	}
	counts := map[string]int{}
	for _, e := range res.ChangeSet.Entries {
		counts[string(e.Action)]++
	}
	return fmt.Sprintf("applied: %d created, %d configured, %d unchanged",
		counts["created"], counts["configured"], counts["unchanged"])
}

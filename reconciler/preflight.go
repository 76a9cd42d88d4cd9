package reconciler

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// maxPreflightProblems bounds status.preflight.problems (the CRD allows
// as many); maxConditionProblems bounds the problems the Ready and
// Stalled conditions quote, which must stay readable in `kubectl get`.
const (
	maxPreflightProblems = 200
	maxConditionProblems = 10
)

// preflight checks a revision's plan once, before its first stage:
// variables left unset, stages that select nothing, readiness expressions
// over the cost limit, and, against the cluster the stages act on, kinds
// not served, namespaces missing, objects the API server refuses
// (stages.Executor.Preflight). While an error stands nothing is applied:
// the deployment is Stalled with reason PreflightFailed, the conditions
// quote the first problems and status.preflight lists them all. Warnings
// do not stop the walk; they are kept in status.preflight and sent as an
// event.
//
// A plan from the cache passed preflight at this revision already: a
// plan that fails is dropped from the cache, so a retry checks again.
func (r *Reconciler) preflight(ctx context.Context, a *attempt) (bool, error) {
	if a.planned || sameWalk(a.cd, a.revision) && walkBegun(a.cd) {
		// Checked already: the walk of this revision began, which it does
		// only after preflight passed (a restarted daemon, a new leader,
		// the Capstan a pivot moved the deployment to).
		return false, nil
	}
	// Stages after a pivot run in the cluster the pivot moves the
	// deployment to, by the Capstan there: checked offline only here.
	afterPivot := len(a.plan.Stages)
	for i, stage := range a.plan.Stages {
		if stage.Action == capstanv1.StageActionPivot {
			afterPivot = i
			break
		}
	}
	key := client.ObjectKeyFromObject(a.cd)
	report := preflight.Report{Problems: unsetProblems(a.rendered)}
	files := fileIndex(a.rendered)
	// The dry runs' answers go with the plan (cached for this revision)
	// to the stages' applies, which then need not send them again.
	a.plan.DryRuns = &stages.DryRuns{}
	exec, err := r.local(a.cd)
	if err != nil {
		return false, err
	}
	checked, err := exec.Preflight(ctx, a.plan, stages.Owner{Name: a.cd.Name, Namespace: a.cd.Namespace}, stages.PreflightOptions{
		File: func(obj *unstructured.Unstructured) string { return files[obj] },
		Skip: func(obj *unstructured.Unstructured) bool { return a.rendered != nil && a.rendered.HasUnset(obj) },
		// Stages that act on another cluster are checked offline only:
		// that cluster is often one an earlier stage builds.
		Here: func(i int) bool { return i <= afterPivot && kubeConfigFor(a.cd, &a.plan.Stages[i]) == nil },
		Keep: a.plan.DryRuns,
		// Objects the last walk left as they are now need no dry run.
		Unchanged: r.unchangedSinceReady(a),
	})
	if err != nil {
		r.plans.drop(key)
		return false, fmt.Errorf("preflight: %w", err)
	}
	report.Problems = append(report.Problems, checked.Problems...)

	// The verdict is written with the walk's first write when it passes,
	// and by conclude when it stalls the revision: no write of its own.
	a.cd.Status.Preflight = preflightStatus(a.revision, report)
	if report.Err() != nil {
		r.plans.drop(key)
		return false, stages.Stalled(&stages.PreflightError{Report: report, Limit: maxConditionProblems})
	}
	if w := report.Warnings(); len(w) > 0 {
		log.FromContext(ctx).Info("preflight passed with warnings", "revision", a.revision, "warnings", len(w))
		r.event(a.cd, "Warning", "PreflightWarning", "preflight at %s passed with %s", a.revision, report.Summary())
	}
	return false, nil
}

// walkBegun reports whether a stage of cd's walk has started.
func walkBegun(cd *capstanv1.ClusterDeployment) bool {
	for _, st := range cd.Status.Stages {
		if st.State != capstanv1.StagePending && st.State != "" {
			return true
		}
	}
	return false
}

// unsetProblems turns the variables render left unset into preflight
// problems.
func unsetProblems(rendered *render.Result) []preflight.Problem {
	if rendered == nil {
		return nil
	}
	var out []preflight.Problem
	for _, e := range rendered.Unset {
		// render names objects Kind/namespace/name; preflight `Kind namespace/name`.
		object := strings.Replace(e.Object, "/", " ", 1)
		msg := e.Err.Error()
		if e.File != "" {
			msg += " (in " + e.File + ")"
		}
		out = append(out, preflight.Problem{Object: object, Field: e.Field, Message: msg})
	}
	return out
}

// fileIndex maps each rendered object to its file.
func fileIndex(rendered *render.Result) map[*unstructured.Unstructured]string {
	files := map[*unstructured.Unstructured]string{}
	if rendered == nil {
		return files
	}
	for i, obj := range rendered.Objects {
		if rendered.Files[i] != "" {
			files[obj] = rendered.Files[i]
		}
	}
	return files
}

// preflightStatus is status.preflight for a report: nil when it found
// nothing, so a clean revision leaves no trace.
func preflightStatus(revision string, report preflight.Report) *capstanv1.PreflightStatus {
	if len(report.Problems) == 0 {
		return nil
	}
	st := &capstanv1.PreflightStatus{Revision: revision, Errors: int32(len(report.Errors())), Warnings: int32(len(report.Warnings()))}
	for _, p := range report.Problems {
		if len(st.Problems) == maxPreflightProblems {
			break
		}
		severity := "Error"
		if p.Warning {
			severity = "Warning"
		}
		st.Problems = append(st.Problems, capstanv1.PreflightProblem{Severity: severity, Object: p.Object, Field: p.Field, Message: p.Message})
	}
	return st
}

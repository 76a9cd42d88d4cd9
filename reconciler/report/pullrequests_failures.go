package report

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
)

// Event reasons of the pull request watcher (docs/troubleshooting.md).
const (
	// ReasonPullRequestReportFailed: the forge refused or failed a request
	// the pull request comments or commit statuses need. One event per
	// kind of failure; the same failure repeating makes no new one.
	ReasonPullRequestReportFailed = "PullRequestReportFailed"
	// ReasonPullRequestReportRecovered: a request that failed works again.
	ReasonPullRequestReportRecovered = "PullRequestReportRecovered"
)

// What a failed forge request was doing: a failure kind is one of these
// with a reason.
const (
	opList    = "list pull requests"
	opComment = "write the pull request comment"
	opRead    = "read the pull request comment"
	opStatus  = "set the commit status"
	opLookup  = "find the pull request of a revision"
	opToken   = "read the forge token"
)

// opActions name the operations in the action of events, machine-readable.
var opActions = map[string]string{
	opList: "ListPullRequests", opComment: "WriteComment", opRead: "ReadComment", opStatus: "SetCommitStatus",
	opLookup: "FindPullRequest", opToken: "ReadToken",
}

// Reasons of capstan_pullrequest_report_failures_total.
const (
	failUnauthorized = "unauthorized"
	failForbidden    = "forbidden"
	failNotFound     = "not_found"
	failRateLimited  = "rate_limited"
	failServerError  = "server_error"
	failUnreachable  = "unreachable"
	failRejected     = "rejected"
	failToken        = "token"
)

// errHandedOver stops a write in a round that began before sharding gave
// the group to another replica: its new owner writes.
var errHandedOver = errors.New("the pull requests of this repository belong to another replica now (sharding)")

// reportedError is a failure already logged, counted and evented (or a
// handover, which is none): the caller logs it no more.
type reportedError struct{ err error }

func (e *reportedError) Error() string { return e.err.Error() }
func (e *reportedError) Unwrap() error { return e.err }

// failureReason is the reason label of a failed forge request; "" for an
// error that is not the forge's (reading a Secret, planning).
func failureReason(op string, err error) string {
	if op == opToken {
		return failToken
	}
	var fe *forge.Error
	if !errors.As(err, &fe) {
		return ""
	}
	switch s := fe.StatusCode; {
	case s == 0:
		return failUnreachable
	case s == http.StatusUnauthorized:
		return failUnauthorized
	case s == http.StatusTooManyRequests,
		// GitHub answers 403 to a token out of its primary or secondary
		// rate limit, and says so.
		s == http.StatusForbidden && strings.Contains(strings.ToLower(fe.Err.Error()), "rate limit"):
		return failRateLimited
	case s == http.StatusForbidden:
		return failForbidden
	case s == http.StatusNotFound:
		return failNotFound
	case s >= 500:
		return failServerError
	}
	return failRejected
}

// outcome records how one forge request of the group went. A failure is
// counted every time; it is logged at error level and evented on cds
// only when it is a new kind for op (quiet while it repeats), and its end
// is logged and evented once. It returns err, marked as reported when it
// was the forge's.
func (w *PullRequests) outcome(ctx context.Context, g *group, st *groupState, op string, cds []*capstanv1.ClusterDeployment, err error) error {
	logger := log.FromContext(ctx)
	if err == nil {
		if was := st.failing[op]; was != "" {
			delete(st.failing, op)
			logger.Info("pull requests: the forge works again", "operation", op, "failedWith", was)
			w.event(st, cds, corev1.EventTypeNormal, ReasonPullRequestReportRecovered, opActions[op],
				"%s %s on %s works again (it failed with %s)", g.cfg.Provider, op, g.repo, was)
		}
		return nil
	}
	if errors.Is(err, errHandedOver) {
		return &reportedError{err}
	}
	reason := failureReason(op, err)
	if reason == "" {
		return err
	}
	w.metrics.Failure(string(g.cfg.Provider), reason)
	w.forgeFailed(st, err)
	if st.failing[op] == reason {
		logger.V(1).Info("pull requests: the forge still fails", "operation", op, "reason", reason, "error", st.redact(err.Error()))
		return &reportedError{err}
	}
	st.failing[op] = reason
	logger.Error(errors.New(st.redact(err.Error())), "pull requests: the forge failed; trying again at the next interval, quiet until it works again or fails otherwise",
		"operation", op, "reason", reason, "metric", metrics.PullRequestReportFailures)
	// The failure's reason is in the action too: the event recorder
	// folds events that differ only in their note into the first one.
	w.event(st, cds, corev1.EventTypeWarning, ReasonPullRequestReportFailed, opActions[op]+"/"+reason,
		"%s could not %s on %s (%s): %s; counted in %s, see docs/troubleshooting.md",
		g.cfg.Provider, op, g.repo, reason, err.Error(), metrics.PullRequestReportFailures)
	return &reportedError{err}
}

// maxEventNote is the longest note events.k8s.io/v1 takes.
const maxEventNote = 1024

// event tells every deployment of cds, with the token scrubbed.
func (w *PullRequests) event(st *groupState, cds []*capstanv1.ClusterDeployment, typ, reason, action, format string, args ...any) {
	if w.opts.Events == nil {
		return
	}
	note := st.redact(fmt.Sprintf(format, args...))
	if len(note) > maxEventNote {
		// The API server refuses a longer note, and the event with it.
		note = strings.ToValidUTF8(note[:maxEventNote-3], "") + "..."
	}
	for _, cd := range cds {
		w.opts.Events.Eventf(cd, nil, typ, reason, action, "%s", note)
	}
}

// redact removes the group's forge token from text: the forge's errors
// leave it out already, this is for whatever else an error may quote.
func (st *groupState) redact(text string) string {
	if len(st.token) < 4 {
		return text
	}
	return strings.ReplaceAll(text, st.token, "[redacted]")
}

// unreported drops from err the failures outcome reported already, so
// that they are not logged twice.
func unreported(err error) error {
	if err == nil {
		return nil
	}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		var keep []error
		for _, e := range joined.Unwrap() {
			if e = unreported(e); e != nil {
				keep = append(keep, e)
			}
		}
		return errors.Join(keep...)
	}
	var rep *reportedError
	if errors.As(err, &rep) {
		return nil
	}
	return err
}

package sources

import (
	"errors"
	"fmt"
	"time"

	"github.com/capstan-dev/capstan/failure"
)

// Reasons of source failures, in conditions, events and
// docs/troubleshooting.md. Each starts with "Source", which is how status
// readers tell a source failure from others (api/v1alpha1 summary.go).
const (
	// ReasonAuthenticationFailed: the remote refused the credentials.
	ReasonAuthenticationFailed = "SourceAuthenticationFailed"
	// ReasonSourceNotFound: the repository, ref, tag or path is not there.
	ReasonSourceNotFound = "SourceNotFound"
	// ReasonArtifactRefused: the content breaks a limit or a rule.
	ReasonArtifactRefused = "SourceArtifactRefused"
	// ReasonSourceInvalid: the source's own settings are wrong.
	ReasonSourceInvalid = "SourceInvalid"
	// ReasonSourceUnavailable: the remote did not answer, or answered
	// with an error that may pass.
	ReasonSourceUnavailable = "SourceUnavailable"
	// ReasonSourceTimeout: the remote did not finish answering within
	// the deployment's spec.timeout (docs/deadlines.md).
	ReasonSourceTimeout = "SourceTimeout"
)

// The errors below give a source failure its reason and policy
// (failure.Error). A source wraps one of them (with %w, next to the
// underlying cause); errors.Is tells them apart, failure.From reads their
// reason and policy. The first four need a human: the reconciler reports
// the deployment as stalled and polls at its interval instead of
// hot-looping. An error that wraps none of them is transient.
var (
	// ErrAuth means the remote refused the credentials, or wanted some and
	// got none.
	ErrAuth = failure.New(ReasonAuthenticationFailed, failure.PolicyStalled, errors.New("authentication failed"))
	// ErrNotFound means the repository, branch, tag or path does not exist
	// on the remote.
	ErrNotFound = failure.New(ReasonSourceNotFound, failure.PolicyStalled, errors.New("not found"))
	// ErrRefused means the content was fetched but Capstan will not use it:
	// it breaks a size limit, has a path or symlink that leaves the artifact
	// root, or has a file type an artifact cannot hold.
	ErrRefused = failure.New(ReasonArtifactRefused, failure.PolicyStalled, errors.New("content refused"))
	// ErrInvalid means the source's own settings are wrong: a malformed URL,
	// an unsupported scheme, an unparsable key.
	ErrInvalid = failure.New(ReasonSourceInvalid, failure.PolicyStalled, errors.New("invalid source settings"))
	// ErrUnavailable means the remote could not be asked or answered with
	// an error that may pass: a refused connection, a timeout, a 5xx.
	ErrUnavailable = failure.New(ReasonSourceUnavailable, failure.PolicyRetry, errors.New("source unavailable"))
)

// ErrTimeout means the remote did not finish answering in time: a slow
// or stuck server, or one that trickles its answer. It is retried.
var ErrTimeout = failure.New(ReasonSourceTimeout, failure.PolicyRetry, errors.New("timed out"))

// TimedOut is the error of an operation on a source (op: "fetch",
// "revision check") of url that did not finish within limit, the
// deployment's spec.timeout: "fetch of URL did not finish within 3m0s
// (spec.timeout)". It is retried with backoff (ErrTimeout); cause, what
// the cut-off operation returned, stays reachable through errors.Is.
// url must carry no credentials.
func TimedOut(op, url string, limit time.Duration, cause error) error {
	return &timeoutError{op: op, url: url, limit: limit, cause: cause}
}

type timeoutError struct {
	op, url string
	limit   time.Duration
	cause   error
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("%s of %s did not finish within %s (spec.timeout); retried with backoff: "+
		"check the server, or raise spec.timeout for a source that is slow but sound", e.op, e.url, e.limit)
}

// Failure implements failure.Classified: the timeout decides, whatever
// the cut-off operation made of its cancelled context.
func (e *timeoutError) Failure() *failure.Error {
	return &failure.Error{Reason: ReasonSourceTimeout, Policy: failure.PolicyRetry, Err: e}
}

// Unwrap returns ErrTimeout and the cause.
func (e *timeoutError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrTimeout}
	}
	return []error{ErrTimeout, e.cause}
}

// IsStalled reports whether err is one that needs a human to change the
// source or its settings before a retry can succeed.
func IsStalled(err error) bool {
	return failure.IsStalled(err)
}

// Unavailable gives err, a failure of a source to answer, the reason and
// policy of ErrUnavailable unless it carries its own.
func Unavailable(err error) error {
	return failure.Default(err, ReasonSourceUnavailable, failure.PolicyRetry)
}

package failure

import "time"

// Policy says what may heal a failure.
type Policy string

const (
	// PolicyRetry is a transient failure: the same attempt is made again
	// after a backoff.
	PolicyRetry Policy = "Retry"
	// PolicyWait is not a failure: something else must happen first.
	PolicyWait Policy = "Wait"
	// PolicyStalled is a failure that only a change of the input can heal.
	PolicyStalled Policy = "Stalled"
)

// Error is one failure with its reason and policy. Its message is the
// message of Err: say what was being done, to which file, object or
// field, what was expected and what to do next.
type Error struct {
	// Reason is the CamelCase reason of the conditions and events it
	// leads to, e.g. "SourceAuthenticationFailed".
	Reason string
	// Policy says what may heal it.
	Policy Policy
	// Err is the failure itself.
	Err error
	// RetryAfter, when set, is when to look again: for something waited
	// for that no watch reports (Wait), or a server's Retry-After.
	RetryAfter time.Duration
}

// Error returns the message of the underlying error.
func (e *Error) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// New returns an Error with reason and policy over err. Use it for
// sentinels (var ErrAuth = failure.New(...)): errors.Is finds a sentinel
// in any chain that wraps it, and its reason and policy come with it.
func New(reason string, policy Policy, err error) *Error {
	return &Error{Reason: reason, Policy: policy, Err: err}
}

// Retryable marks err as transient under reason; nil stays nil.
func Retryable(reason string, err error) error { return wrap(reason, PolicyRetry, err) }

// Waiting marks err as something to wait for under reason; nil stays nil.
func Waiting(reason string, err error) error { return wrap(reason, PolicyWait, err) }

// Stalled marks err as needing a change of the input under reason; nil
// stays nil.
func Stalled(reason string, err error) error { return wrap(reason, PolicyStalled, err) }

func wrap(reason string, policy Policy, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Reason: reason, Policy: policy, Err: err}
}

// Default gives err the reason and policy given unless it carries its own
// already (an Error anywhere in its chain): the innermost producer that
// knows best keeps its word. nil stays nil.
func Default(err error, reason string, policy Policy) error {
	if err == nil {
		return nil
	}
	if _, ok := From(err); ok {
		return err
	}
	return wrap(reason, policy, err)
}

// Classified is implemented by error types that keep their own fields
// (a file and field, a cluster) and carry a reason and policy too: Failure
// returns the Error they stand for, whose Err is the error itself.
type Classified interface {
	error
	Failure() *Error
}

// From returns the Error that decides err's reason and policy. Along a
// chain of wrappers the outermost Error (or Classified) decides, so a caller that knows
// better overrides what it wraps. Of several errors joined (errors.Join,
// or any Unwrap() []error) the gravest decides, stalled before retry
// before wait: one object the server refuses stalls its whole wave,
// however many others only timed out. Errors that carry no Error have no
// say.
func From(err error) (*Error, bool) {
	e := decide(err)
	return e, e != nil
}

func decide(err error) *Error {
	for err != nil {
		switch x := err.(type) {
		case *Error:
			return x
		case Classified:
			return x.Failure()
		case interface{ Unwrap() []error }:
			var best *Error
			for _, child := range x.Unwrap() {
				if e := decide(child); e != nil && (best == nil || gravity(e.Policy) > gravity(best.Policy)) {
					best = e
				}
			}
			return best
		case interface{ Unwrap() error }:
			err = x.Unwrap()
		default:
			return nil
		}
	}
	return nil
}

// gravity orders policies for joined errors.
func gravity(p Policy) int {
	switch p {
	case PolicyStalled:
		return 3
	case PolicyRetry, "":
		return 2
	default:
		return 1
	}
}

// PolicyOf returns err's policy; an error that carries none is retried.
func PolicyOf(err error) Policy {
	if e, ok := From(err); ok && e.Policy != "" {
		return e.Policy
	}
	return PolicyRetry
}

// ReasonOf returns err's reason, or def when it carries none.
func ReasonOf(err error, def string) string {
	if e, ok := From(err); ok && e.Reason != "" {
		return e.Reason
	}
	return def
}

// IsStalled reports whether err needs a change of the input.
func IsStalled(err error) bool { return err != nil && PolicyOf(err) == PolicyStalled }

// IsWaiting reports whether err is something to wait for, not a failure.
func IsWaiting(err error) bool { return err != nil && PolicyOf(err) == PolicyWait }

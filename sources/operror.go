package sources

import "strings"

// opError is the error of one operation on a remote source: a message
// written for the operator (what was done to which URL, the policy's word,
// what to do, what the remote said) that keeps the policy sentinel and the
// remote's cause reachable through errors.Is and errors.As. The git and
// OCI sources build theirs with OpError, so both read the same way.
type opError struct {
	msg  string
	errs []error
}

func (e *opError) Error() string   { return e.msg }
func (e *opError) Unwrap() []error { return e.errs }

// OpError builds the error of an operation: subject says what was done to
// what ("list refs https://host/repo.git branch main"); kind is one of this
// package's sentinels, or nil for a transient error; hint says what to do;
// cause is what the library or remote returned, or nil. Each of secrets
// four bytes or longer is replaced by "[redacted]" in the message, in case
// a server or a library ever echoes a credential; shorter ones would match
// ordinary words, and the transports never echo them anyway.
func OpError(subject string, kind error, hint string, cause error, secrets ...string) error {
	var b strings.Builder
	b.WriteString(subject)
	if kind != nil {
		b.WriteString(": " + kind.Error())
	}
	if hint != "" {
		b.WriteString(": " + hint)
	}
	if cause != nil {
		// Servers end their messages with newlines, and go-git leaves a
		// dangling ": " when a server sends no message at all.
		b.WriteString(": " + strings.TrimRight(strings.TrimSpace(cause.Error()), ": "))
	}
	e := &opError{msg: redact(b.String(), secrets...)}
	for _, err := range []error{kind, cause} {
		if err != nil {
			e.errs = append(e.errs, err)
		}
	}
	return e
}

// redact replaces every secret of four bytes or more in msg with
// "[redacted]".
func redact(msg string, secrets ...string) string {
	for _, s := range secrets {
		if len(s) >= 4 {
			msg = strings.ReplaceAll(msg, s, "[redacted]")
		}
	}
	return msg
}

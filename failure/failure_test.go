package failure_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/capstan-dev/capstan/failure"
)

// classified stands for a type of its own that carries a reason and policy.
type classified struct{ msg string }

func (c *classified) Error() string { return c.msg }
func (c *classified) Failure() *failure.Error {
	return &failure.Error{Reason: "OwnType", Policy: failure.PolicyStalled, Err: c}
}

var errSentinel = failure.New("SentinelReason", failure.PolicyStalled, errors.New("sentinel"))

func TestTheErrorThatDecides(t *testing.T) {
	plain := errors.New("connection refused")
	for _, tc := range []struct {
		name       string
		err        error
		wantPolicy failure.Policy
		wantReason string
	}{
		{"an error that carries nothing is retried", plain, failure.PolicyRetry, "Default"},
		{"a wrapped sentinel gives its reason and policy", fmt.Errorf("fetch: %w: %w", errSentinel, plain), failure.PolicyStalled, "SentinelReason"},
		{"the outermost wrapper overrides what it wraps", failure.Waiting("Outer", fmt.Errorf("x: %w", errSentinel)), failure.PolicyWait, "Outer"},
		{"a type of its own classifies itself", fmt.Errorf("render: %w", &classified{"bad YAML"}), failure.PolicyStalled, "OwnType"},
		{"of errors joined the gravest decides", errors.Join(failure.Retryable("Timeout", plain), failure.Waiting("Later", plain), &classified{"bad"}), failure.PolicyStalled, "OwnType"},
		{"joined with untyped errors, the typed one decides", errors.Join(plain, failure.Waiting("Later", plain)), failure.PolicyWait, "Later"},
		{"Default keeps what an error carries", failure.Default(fmt.Errorf("x: %w", errSentinel), "Other", failure.PolicyRetry), failure.PolicyStalled, "SentinelReason"},
		{"Default gives what an error lacks", failure.Default(plain, "Other", failure.PolicyWait), failure.PolicyWait, "Other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := failure.PolicyOf(tc.err); got != tc.wantPolicy {
				t.Errorf("PolicyOf = %s, want %s", got, tc.wantPolicy)
			}
			if got := failure.ReasonOf(tc.err, "Default"); got != tc.wantReason {
				t.Errorf("ReasonOf = %s, want %s", got, tc.wantReason)
			}
			if failure.IsStalled(tc.err) != (tc.wantPolicy == failure.PolicyStalled) {
				t.Errorf("IsStalled = %v, want %v", failure.IsStalled(tc.err), tc.wantPolicy == failure.PolicyStalled)
			}
		})
	}
}

func TestWrappersKeepMessageAndIdentity(t *testing.T) {
	err := fmt.Errorf("check source: %w", errSentinel)
	if !errors.Is(err, errSentinel) {
		t.Error("errors.Is does not find the sentinel through a wrapper")
	}
	wrapped := failure.Stalled("R", err)
	if wrapped.Error() != err.Error() {
		t.Errorf("message %q, want the wrapped error's %q", wrapped.Error(), err.Error())
	}
	if failure.Stalled("R", nil) != nil || failure.Retryable("R", nil) != nil || failure.Default(nil, "R", failure.PolicyRetry) != nil {
		t.Error("a nil error did not stay nil")
	}
}

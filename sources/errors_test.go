package sources

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/failure"
)

// A source operation cut by spec.timeout says which operation on which
// source ran out of which time, and is retried under its own reason,
// whatever the source made of its cancelled context (often "unavailable")
// and however the reconciler wraps it.
func TestTimedOutSaysWhatAndIsRetried(t *testing.T) {
	cause := fmt.Errorf("list refs of https://git.example/infra.git: %w: %w", ErrUnavailable, context.DeadlineExceeded)
	tests := []struct {
		name, op, wantMsg string
		wrap              func(error) error
	}{
		{"fetch, as the source cache returns it", "fetch",
			"fetch of https://git.example/infra.git did not finish within 3m0s (spec.timeout)", func(err error) error { return err }},
		{"revision check, wrapped by the reconciler", "revision check",
			"check source: revision check of https://git.example/infra.git did not finish within 3m0s (spec.timeout)",
			func(err error) error { return fmt.Errorf("check source: %w", Unavailable(err)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.wrap(TimedOut(tt.op, "https://git.example/infra.git", 3*time.Minute, cause))
			if msg := err.Error(); len(msg) < len(tt.wantMsg) || msg[:len(tt.wantMsg)] != tt.wantMsg {
				t.Errorf("message %q, want it to start with %q", msg, tt.wantMsg)
			}
			if got := failure.ReasonOf(err, ""); got != ReasonSourceTimeout {
				t.Errorf("reason %q, want %q", got, ReasonSourceTimeout)
			}
			if got := failure.PolicyOf(err); got != failure.PolicyRetry {
				t.Errorf("policy %q, want %q: a slow source may answer in time next time", got, failure.PolicyRetry)
			}
			if IsStalled(err) {
				t.Error("a timeout is stalled; it must be retried")
			}
			if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("errors.Is finds ErrTimeout %v, the cause %v; want both", errors.Is(err, ErrTimeout), errors.Is(err, context.DeadlineExceeded))
			}
		})
	}
}

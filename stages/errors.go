package stages

import (
	"errors"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// StalledError marks an error that retrying cannot fix: the input or the
// cluster must change first (an invalid object, a missing CRD, an
// expression that does not compile). The reconciler reports it as Stalled
// and does not hot-loop on it.
type StalledError struct {
	Err error
}

func (e *StalledError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *StalledError) Unwrap() error { return e.Err }

// Stalled wraps err as a StalledError.
func Stalled(err error) error {
	if err == nil {
		return nil
	}
	return &StalledError{Err: err}
}

// IsStalled reports whether err, or any error it joins or wraps, is stalled.
func IsStalled(err error) bool {
	var s *StalledError
	return errors.As(err, &s)
}

// isInvalid reports whether the API server refused the object itself: a
// field the schema does not allow, a value of the wrong type. Server-side
// apply reports a type mismatch as "failed to create typed patch object"
// with no reason, so that is matched by its text.
func isInvalid(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) ||
		strings.Contains(err.Error(), "failed to create typed patch object")
}

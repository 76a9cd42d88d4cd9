package stages

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
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

// UnreachableError says that the cluster a stage acts on cannot be used
// now: it does not answer (connection refused, DNS, TLS, a timeout) or
// the kubeconfig that reaches it is missing or malformed. It is waiting,
// not failing: the stage stays InProgress and is retried with backoff, and
// nothing counts it as a failure, since the cluster coming back or the
// Secret being fixed heals it without any change to the deployment.
type UnreachableError struct {
	// Cluster names the cluster, by the Secret its kubeconfig is read
	// from ("Secret ns/name").
	Cluster string
	// Err says why; it never holds the kubeconfig's content.
	Err error
}

func (e *UnreachableError) Error() string {
	return "cluster of " + e.Cluster + " unreachable: " + e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *UnreachableError) Unwrap() error { return e.Err }

// IsUnreachable reports whether err, or any error it joins or wraps, is
// an UnreachableError.
func IsUnreachable(err error) bool {
	var u *UnreachableError
	return errors.As(err, &u)
}

// isNetworkError reports an error of the path to a cluster rather than of
// a request: the connection refused or reset, a name that does not
// resolve, a TLS handshake or certificate that fails, a timeout.
func isNetworkError(err error) bool {
	// A context that ended is the caller's deadline, not the network's,
	// though it says Timeout too.
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var (
		netErr   net.Error
		opErr    *net.OpError
		dnsErr   *net.DNSError
		certErr  *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invalid  x509.CertificateInvalidError
		recordEr tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &opErr), errors.As(err, &dnsErr), errors.As(err, &certErr),
		errors.As(err, &unknown), errors.As(err, &hostErr), errors.As(err, &invalid), errors.As(err, &recordEr):
		return true
	case errors.As(err, &netErr) && netErr.Timeout():
		return true
	case utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err):
		return true
	}
	// An answer of the API server is not a problem of the path to it, even
	// when it quotes one (a webhook the server could not call).
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return false
	}
	// Errors that lost their type on the way (discovery joins them as text).
	msg := err.Error()
	for _, s := range []string{"connection refused", "no such host", "i/o timeout", "x509: ", "tls: ", "connection reset by peer", "TLS handshake timeout"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

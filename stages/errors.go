package stages

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// Reasons of stage failures, in conditions, events and
// docs/troubleshooting.md.
const (
	// ReasonStageFailed: an attempt at a stage failed; what the message
	// says decides whether a retry helps (the policy).
	ReasonStageFailed = "StageFailed"
	// ReasonStageTimedOut: a stage was in progress longer than its timeout.
	ReasonStageTimedOut = "StageTimedOut"
	// ReasonApplyFailed: the API server did not take an object, for a
	// reason that may pass (a timeout, a conflict, a 5xx).
	ReasonApplyFailed = "ApplyFailed"
	// ReasonKindNotServed: the cluster does not serve an object's kind.
	ReasonKindNotServed = "KindNotServed"
	// ReasonObjectInvalid: the API server refused an object as invalid.
	ReasonObjectInvalid = "ObjectInvalid"
	// ReasonObjectTooLarge: an object is over the API server's request
	// size limit.
	ReasonObjectTooLarge = "ObjectTooLarge"
	// ReasonForbidden: Capstan's identity may not write an object's kind.
	ReasonForbidden = "Forbidden"
	// ReasonOwnershipConflict: an object belongs to another deployment, or
	// exists and may not be taken over.
	ReasonOwnershipConflict = "OwnershipConflict"
	// ReasonReadinessCheckFailed: a readiness expression does not compile,
	// or is over the CEL cost limit on a live object.
	ReasonReadinessCheckFailed = "ReadinessCheckFailed"
	// ReasonPivotBlocked: a pivot stage cannot start or go on until someone
	// acts: no target kubeConfig, a move into another cluster under way,
	// the move's preflight found missing CRDs or a deployment in the way
	// (pivot.ReasonPivotBlocked, which the move's errors carry).
	ReasonPivotBlocked = pivot.ReasonPivotBlocked
	// ReasonFenced: the fencing record of the deployment names another
	// Capstan, which owns it now (after a pivot); this one must not write
	// (pivot.ReasonFenced, which pivot.FencedError carries).
	ReasonFenced = pivot.ReasonFenced
	// ReasonClusterUnreachable: the cluster a stage acts on does not
	// answer, or its kubeconfig cannot be used (waiting, not failing).
	ReasonClusterUnreachable = "ClusterUnreachable"
)

// Stalled marks err as a stage failure that retrying cannot fix: the input
// or the cluster must change first (an invalid object, a missing CRD, an
// expression that does not compile). An err that carries a reason of its
// own (failure.Error) keeps it and becomes stalled.
func Stalled(err error) error {
	return failure.Stalled(failure.ReasonOf(err, ReasonStageFailed), err)
}

// IsStalled reports whether err is stalled (failure.IsStalled): of errors
// joined, any one stalled stalls them all.
func IsStalled(err error) bool {
	return failure.IsStalled(err)
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
// not failing (failure.PolicyWait, reason ClusterUnreachable): the stage
// stays InProgress and is retried with backoff, and nothing counts it as a
// failure, since the cluster coming back or the Secret being fixed heals
// it without any change to the deployment.
type UnreachableError struct {
	// Cluster names the cluster, by the Secret its kubeconfig is read
	// from ("Secret ns/name").
	Cluster string
	// Err says why; it never holds the kubeconfig's content.
	Err error
}

func (e *UnreachableError) Error() string {
	if e.Cluster == LocalClusterName {
		// "cluster of local" says nothing; the local cluster is the one
		// Capstan (or the CLI's --kubeconfig) talks to without a Secret.
		return "cluster unreachable: " + e.Err.Error()
	}
	return "cluster of " + e.Cluster + " unreachable: " + e.Err.Error()
}

// Unwrap returns the underlying error.
func (e *UnreachableError) Unwrap() error { return e.Err }

// Failure gives e its reason and policy: waiting for the cluster.
func (e *UnreachableError) Failure() *failure.Error {
	return &failure.Error{Reason: ReasonClusterUnreachable, Policy: failure.PolicyWait, Err: e}
}

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

// IsUnanswered reports whether err is of a request that got no answer
// about the object it was for, so that it stops a look at the whole
// cluster instead of being that object's problem:
//
//   - no answer came: a connection refused, reset or cut, a name that
//     does not resolve, TLS, a transport timeout (isNetworkError); any
//     failed round trip (client-go wraps every request that got no HTTP
//     response in a *url.Error, whatever the transport said); a context
//     that ended;
//   - the API server, or what stands in front of it, answered that it
//     serves no request now: 503 (shutting down, or a load balancer with
//     no API server behind it), 502 (only a proxy says it), 504 and
//     ServerTimeout (the server or its storage could not finish in time),
//     429 after client-go's own retries (priority and fairness turns
//     Capstan's requests away, whatever the object);
//   - 401: the cluster does not take the credentials; no object is to
//     blame.
//
// An answer about the object is not: Invalid, BadRequest, Forbidden,
// NotFound, Conflict, RequestEntityTooLarge, a kind not served. Nor is an
// InternalError: the API server sends it when a webhook of the object's
// kind fails or does not answer (it answered, about this object; others
// go through), and a 500 without a reason, which server-side apply gives
// for a field of the wrong type. The one 503 that is about an object's
// kind, an aggregated API whose server is down, is taken for the cluster:
// it cannot be told from a load balancer's 503, and a stage applying such
// an object would wait on that API anyway.
func IsUnanswered(err error) bool {
	if err == nil {
		return false
	}
	var status apierrors.APIStatus
	answered := errors.As(err, &status)
	var transport *url.Error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), isNetworkError(err):
		return true
	case errors.As(err, &transport) && !answered:
		return true
	case apierrors.IsServiceUnavailable(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsTooManyRequests(err), apierrors.IsUnauthorized(err):
		return true
	}
	return answered && status.Status().Code == http.StatusBadGateway
}

// classify is classifyApplyErrorAs for what e sent, as the identity e
// acts as.
func (e *Executor) classify(obj *unstructured.Unstructured, err error) error {
	return classifyApplyErrorAs(obj, err, e.actor)
}

// classifyApplyErrorAs names the object and gives an error of the API
// server its reason and policy. Stalled, because a retry of the same
// object cannot succeed: a kind the cluster does not serve, an object it
// refuses as invalid, one over its request size limit, a kind the
// identity may not write (RBAC; looked at again every forbiddenRecheck,
// since granting the permission heals it at the same revision). Anything
// else (a timeout, a conflict, a webhook that did not answer, a namespace
// being terminated) is retried. actor is the deployment's ServiceAccount
// ("namespace/name") the request was made as, which the hint for a
// missing permission names; empty: Capstan's own identity.
func classifyApplyErrorAs(obj *unstructured.Unstructured, err error, actor string) error {
	wrapped := err
	if !strings.Contains(err.Error(), ObjectRef(obj)) {
		wrapped = fmt.Errorf("apply %s: %w", ObjectRef(obj), err)
	}
	switch {
	case meta.IsNoMatchError(err):
		return failure.Stalled(ReasonKindNotServed, fmt.Errorf("apply %s: the cluster does not serve %s (is its CustomResourceDefinition installed?): %w",
			ObjectRef(obj), obj.GroupVersionKind().GroupVersion().WithKind(obj.GetKind()), err))
	case apierrors.IsRequestEntityTooLargeError(err):
		return failure.Stalled(ReasonObjectTooLarge, fmt.Errorf("%w; the API server takes requests up to 3 MiB and stores objects up to 1.5 MiB: "+
			"split the object, or keep large data out of it (a ConfigMap or Secret holds at most 1 MiB)", wrapped))
	case isInvalid(err):
		return failure.Stalled(ReasonObjectInvalid, wrapped)
	case isRBACDenied(err) && actor != "" && strings.Contains(err.Error(), "cannot impersonate"):
		return &failure.Error{Reason: ReasonForbidden, Policy: failure.PolicyStalled, RetryAfter: forbiddenRecheck,
			Err: fmt.Errorf("%w; Capstan may not act as ServiceAccount %s: its own role needs impersonate on serviceaccounts, "+
				"which the role capstan-namespace grants: bound cluster-wide by the plain install (capstan install puts it back), "+
				"and by the multi-tenant install only for ServiceAccounts named capstan-deployer in namespaces where the platform binds it "+
				"(another ServiceAccount needs a Role with its name in resourceNames: docs/tenancy.md, \"What to bind in each tenant namespace\"); "+
				"the stage is tried again every minute, or at once with capstan reconcile", wrapped, actor)}
	case isRBACDenied(err) && actor != "":
		return &failure.Error{Reason: ReasonForbidden, Policy: failure.PolicyStalled, RetryAfter: forbiddenRecheck,
			Err: fmt.Errorf("%w; the deployment acts as ServiceAccount %s (spec.serviceAccountName, else capstan run's --default-service-account): "+
				"bind a Role or ClusterRole with this permission to it (docs/tenancy.md); "+
				"the stage is tried again every minute, or at once with capstan reconcile", wrapped, actor)}
	case isRBACDenied(err):
		return &failure.Error{Reason: ReasonForbidden, Policy: failure.PolicyStalled, RetryAfter: forbiddenRecheck,
			Err: fmt.Errorf("%w; grant Capstan's ServiceAccount this permission with a ClusterRole labelled %s: \"true\" (docs/install.md#rbac); "+
				"the stage is tried again every minute, or at once with capstan reconcile", wrapped, AggregateToApplyLabel)}
	}
	return failure.Retryable(ReasonApplyFailed, wrapped)
}

// forbiddenRecheck is how often a stage stalled on a permission Capstan
// lacks is tried again: the fix is in the cluster's RBAC, not the input.
const forbiddenRecheck = time.Minute

// AggregateToApplyLabel marks the ClusterRoles whose rules the
// capstan-apply ClusterRole aggregates: the kinds Capstan may apply.
const AggregateToApplyLabel = "capstan.dev/aggregate-to-apply"

// isRBACDenied reports a request the authorizer refused ("User ... cannot
// patch resource ..."), as opposed to a Forbidden from admission.
func isRBACDenied(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), " cannot ")
}

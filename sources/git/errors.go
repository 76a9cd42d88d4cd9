package git

import (
	"context"
	"errors"
	"strings"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/skeema/knownhosts"

	"github.com/capstan-dev/capstan/sources"
)

// newError builds the error of op (e.g. "list refs", "fetch") on s. kind is
// a sources sentinel or nil for a retryable error; hint says what to do.
func (s *Source) newError(op string, kind error, hint string, cause error) error {
	return sources.OpError(op+" "+s.display+" "+s.ref.String(), kind, hint, cause, s.opts.Auth.Password)
}

// classify turns a go-git error of op into an error with the policy
// and a hint for the operator.
func (s *Source) classify(op string, err error) error {
	hasHTTPCreds := s.opts.Auth.Username != "" || s.opts.Auth.Password != ""
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return s.newError(op, nil, "", err)
	case errors.Is(err, transport.ErrAuthenticationRequired) && !hasHTTPCreds:
		return s.newError(op, sources.ErrAuth,
			"the server requires credentials: set "+s.creds.HTTP, err)
	case errors.Is(err, transport.ErrAuthenticationRequired), errors.Is(err, transport.ErrAuthorizationFailed):
		return s.newError(op, sources.ErrAuth,
			"the server refused the credentials: check "+s.creds.HTTP, err)
	case knownhosts.IsHostKeyChanged(err):
		return s.newError(op, sources.ErrAuth,
			"the server's host key does not match "+s.creds.KnownHosts+"; if the key was rotated on purpose, update it", err)
	case knownhosts.IsHostUnknown(err):
		return s.newError(op, sources.ErrAuth,
			"the server's host key is not in "+s.creds.KnownHosts, err)
	case sources.IsUntrustedCertificate(err):
		return s.newError(op, sources.ErrAuth, sources.UntrustedCertificateHint(s.creds.CA), err)
	case strings.Contains(err.Error(), "ssh: unable to authenticate"):
		return s.newError(op, sources.ErrAuth,
			"the server refused the ssh key: add its public key as a deploy key, or check "+s.creds.SSHKey, err)
	case errors.Is(err, transport.ErrRepositoryNotFound):
		return s.newError(op, sources.ErrNotFound,
			"repository not found (or the credentials may not read it): check spec.source.git.url", err)
	case errors.Is(err, transport.ErrEmptyRemoteRepository):
		return s.newError(op, sources.ErrNotFound,
			"the repository is empty: push "+s.ref.String()+" first", nil)
	case errors.Is(err, gogit.NoMatchingRefSpecError{}), errors.Is(err, plumbing.ErrReferenceNotFound):
		return s.refNotFound(op, nil)
	default:
		return s.newError(op, sources.ErrUnavailable, "", err)
	}
}

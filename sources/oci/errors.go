package oci

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/capstan-dev/capstan/sources"
)

// sourceError carries a message written for the operator (which URL, what
// to do) while keeping the policy sentinel and the cause reachable through
// errors.Is and errors.As.
type sourceError struct {
	msg  string
	errs []error
}

func (e *sourceError) Error() string   { return e.msg }
func (e *sourceError) Unwrap() []error { return e.errs }

// named is anything with a name to show: a repository or a reference.
type named interface{ String() string }

// newError builds the error of op (e.g. "check", "fetch") on what. kind is
// a sources sentinel or nil for a retryable error; hint says what to do.
func (s *Source) newError(op string, what named, kind error, hint string, cause error) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s oci://%s", op, what.String())
	if kind != nil {
		b.WriteString(": " + kind.Error())
	}
	if hint != "" {
		b.WriteString(": " + hint)
	}
	if cause != nil {
		b.WriteString(": " + strings.TrimSpace(cause.Error()))
	}
	e := &sourceError{msg: s.scrub(b.String())}
	for _, err := range []error{kind, cause} {
		if err != nil {
			e.errs = append(e.errs, err)
		}
	}
	return e
}

// scrub removes any configured password or token from a message, in case a
// registry ever echoes one. Very short secrets are left alone: they would
// match ordinary words.
func (s *Source) scrub(msg string) string {
	if len(s.opts.Auth.DockerConfig) == 0 {
		return msg
	}
	kc, err := ParseDockerConfig(s.opts.Auth.DockerConfig)
	if err != nil {
		return msg
	}
	for _, ac := range kc.(staticKeychain) {
		for _, secret := range []string{ac.Password, ac.IdentityToken, ac.RegistryToken} {
			if len(secret) >= 4 {
				msg = strings.ReplaceAll(msg, secret, "[redacted]")
			}
		}
	}
	return msg
}

// classify turns a go-containerregistry error of op on what into a
// sourceError with the policy and a hint for the operator.
func (s *Source) classify(op string, what named, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return s.newError(op, what, nil, "", err)
	}
	if sources.IsUntrustedCertificate(err) {
		return s.newError(op, what, sources.ErrAuth, sources.UntrustedCertificateHint(s.opts.Auth.caFrom()), err)
	}
	var terr *transport.Error
	if !errors.As(err, &terr) {
		return s.newError(op, what, sources.ErrUnavailable, "", err)
	}
	codes := map[transport.ErrorCode]bool{}
	for _, d := range terr.Errors {
		codes[d.Code] = true
	}
	switch {
	case terr.StatusCode == http.StatusUnauthorized || codes[transport.UnauthorizedErrorCode]:
		if !s.opts.Auth.hasCredentials() {
			return s.newError(op, what, sources.ErrAuth,
				"the registry requires credentials: set spec.source.oci.secretRef to a docker config Secret", err)
		}
		return s.newError(op, what, sources.ErrAuth,
			"the registry refused the credentials: check the docker config in spec.source.oci.secretRef", err)
	case terr.StatusCode == http.StatusForbidden || codes[transport.DeniedErrorCode]:
		return s.newError(op, what, sources.ErrAuth,
			"the registry denied access: the credentials in spec.source.oci.secretRef may not pull this repository", err)
	case terr.StatusCode == http.StatusNotFound || codes[transport.ManifestUnknownErrorCode] ||
		codes[transport.NameUnknownErrorCode] || codes[transport.BlobUnknownErrorCode]:
		return s.newError(op, what, sources.ErrNotFound, s.notFoundHint(), err)
	default:
		return s.newError(op, what, sources.ErrUnavailable, "", err)
	}
}

func (s *Source) notFoundHint() string {
	switch {
	case s.ref.Digest != "":
		return "the repository has no manifest with that digest: check spec.source.oci.url and ref.digest"
	case s.constraint != nil:
		return "the repository or the chosen tag does not exist: check spec.source.oci.url"
	default:
		return "the repository or tag " + s.ref.Tag + " does not exist: check spec.source.oci.url and ref.tag, or push the artifact"
	}
}

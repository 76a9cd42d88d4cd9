package oci

import (
	"context"
	"errors"
	"net/http"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/capstan-dev/capstan/sources"
)

// named is anything with a name to show: a repository or a reference.
type named interface{ String() string }

// newError builds the error of op (e.g. "check", "fetch") on what. kind is
// a sources sentinel or nil for a retryable error; hint says what to do.
func (s *Source) newError(op string, what named, kind error, hint string, cause error) error {
	return sources.OpError(op+" oci://"+what.String(), kind, hint, cause, s.secrets()...)
}

// secrets are the configured passwords and tokens, kept out of every
// message in case a registry ever echoes one.
func (s *Source) secrets() []string {
	if len(s.opts.Auth.DockerConfig) == 0 {
		return nil
	}
	kc, err := ParseDockerConfig(s.opts.Auth.DockerConfig)
	if err != nil {
		return nil
	}
	var secrets []string
	for _, ac := range kc.(staticKeychain) {
		secrets = append(secrets, ac.Password, ac.IdentityToken, ac.RegistryToken)
	}
	return secrets
}

// classify turns a go-containerregistry error of op on what into an
// error with the policy and a hint for the operator.
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

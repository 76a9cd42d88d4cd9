package forge

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/capstan-dev/capstan/sources"
)

// Error is a failed forge request. It names the forge, what was being done
// to which repository and pull request or commit, and what to check. The
// token is never part of its text.
type Error struct {
	// Forge is the provider that failed.
	Forge Provider
	// Op says what was being done, e.g. "comment on pull request 7".
	Op string
	// Repository is the repository as configured.
	Repository string
	// StatusCode is the HTTP status of the answer; 0 when there was none.
	StatusCode int
	// Hint says what to check.
	Hint string
	// Err is the client library's error.
	Err error

	token string
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("%s: %s of %s: ", e.Forge, e.Op, e.Repository)
	if e.StatusCode != 0 {
		msg += fmt.Sprintf("HTTP %d: ", e.StatusCode)
	}
	msg += e.Err.Error()
	if e.Hint != "" {
		msg += " (" + e.Hint + ")"
	}
	return redact(msg, e.token)
}

func (e *Error) Unwrap() error { return e.Err }

// Retryable reports whether trying again later may succeed (no answer, rate
// limits, server errors), as opposed to a request that needs a human to
// fix the token, the repository name or the base URL.
func (e *Error) Retryable() bool {
	return e.StatusCode == 0 || e.StatusCode == http.StatusTooManyRequests || e.StatusCode >= 500
}

// redact removes the token from text, in case a library echoed it.
func redact(text, token string) string {
	if len(token) < 4 {
		return text
	}
	return strings.ReplaceAll(text, token, "[redacted]")
}

// failure builds the Error of a request: status is the HTTP status of the
// answer (0 for none), scopes what the token needs for this request.
func (p base) failure(op, repo string, status int, scopes string, err error) error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return err
	}
	h := hint(status, p.baseURL, scopes)
	if status == 0 && sources.IsUntrustedCertificate(err) {
		h = sources.UntrustedCertificateHint(p.caFrom)
	}
	return &Error{
		Forge: p.provider, Op: op, Repository: repo, StatusCode: status,
		Hint: h, Err: err, token: p.token,
	}
}

func hint(status int, baseURL, scopes string) string {
	switch {
	case status == 0:
		return "no answer from " + baseURL + ": check the base URL and that Capstan can reach it"
	case status == http.StatusUnauthorized:
		return "the forge refused the token: check that the Secret holds a valid, unexpired token for " + baseURL
	case status == http.StatusForbidden:
		return "the token may not do this: it needs " + scopes
	case status == http.StatusNotFound:
		return "not found: check the repository name, the pull request or commit, and the base URL " + baseURL +
			"; a token that cannot see a private repository gets this too (it needs " + scopes + ")"
	case status == http.StatusTooManyRequests:
		return "rate limited: Capstan tries again later"
	case status >= 500:
		return "the forge failed: Capstan tries again later"
	case status >= 400:
		return "the forge rejected the request"
	}
	return ""
}

// base is what every provider shares.
type base struct {
	provider Provider
	baseURL  string // as shown in errors
	token    string
	caFrom   string // where the CA bundle is set, for hints
}

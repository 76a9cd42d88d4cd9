package report

import (
	"errors"
	"fmt"
	"testing"

	"github.com/capstan-dev/capstan/reconciler/report/forge"
)

// The reason label of a failed forge request says what to do about it:
// the token (unauthorized, forbidden), the repository (not_found), or
// wait (rate_limited, server_error, unreachable).
func TestPullRequestFailureReason(t *testing.T) {
	forgeErr := func(status int, msg string) error {
		return fmt.Errorf("pull request 7: %w", &forge.Error{Forge: forge.ProviderGitHub, Op: "comment", Repository: "acme/infra",
			StatusCode: status, Err: errors.New(msg)})
	}
	for _, tc := range []struct {
		name string
		op   string
		err  error
		want string
	}{
		{"no answer", opComment, forgeErr(0, "dial tcp: connection refused"), failUnreachable},
		{"a token the forge does not know", opComment, forgeErr(401, "Bad credentials"), failUnauthorized},
		{"a token without the scope", opStatus, forgeErr(403, "Resource not accessible by personal access token"), failForbidden},
		{"GitHub's primary rate limit, a 403", opList, forgeErr(403, "API rate limit exceeded for user ID 1"), failRateLimited},
		{"GitHub's secondary rate limit, a 403", opComment, forgeErr(403, "You have exceeded a secondary rate limit"), failRateLimited},
		{"a 429", opList, forgeErr(429, "Too Many Requests"), failRateLimited},
		{"a repository the token cannot see", opList, forgeErr(404, "Not Found"), failNotFound},
		{"the forge failed", opComment, forgeErr(502, "Bad Gateway"), failServerError},
		{"a body the forge refused", opComment, forgeErr(422, "Validation Failed"), failRejected},
		{"the token Secret is missing", opToken, errors.New(`Secret "forge-token" not found`), failToken},
		{"not the forge's (planning)", opComment, errors.New("render: missing.yaml"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := failureReason(tc.op, tc.err); got != tc.want {
				t.Errorf("failureReason(%q, %v) = %q, want %q", tc.op, tc.err, got, tc.want)
			}
		})
	}
}

// A failure reported once is not logged again by the caller, even joined
// with others that were not.
func TestPullRequestUnreported(t *testing.T) {
	plan := errors.New("plan: render failed")
	reported := fmt.Errorf("pull request 7: %w", &reportedError{errors.New("gitea: HTTP 500")})
	if got := unreported(errors.Join(plan, reported)); got == nil || got.Error() != plan.Error() {
		t.Errorf("unreported kept %v, want only %v", got, plan)
	}
	if got := unreported(reported); got != nil {
		t.Errorf("unreported kept %v, want nothing", got)
	}
}

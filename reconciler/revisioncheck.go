package reconciler

import (
	"time"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// revisionShare is the part of its poll interval within which a
// deployment takes the revision that another deployment on the same
// source got from the remote, instead of asking again: a tenth. A commit
// is then seen at most a tenth of an interval later than by a poll of
// its own, while a fleet on one repository asks it about ten times per
// interval, not once per deployment (docs/benchmarks.md, "1,000
// deployments"). A push, and a requested reconcile, always ask.
const revisionShare = 10

// revisionMaxAge is how old a shared answer about cd's source may be for
// this attempt: none when a reconcile was asked for (`capstan reconcile`,
// a push passed on by another replica) and not answered yet.
func revisionMaxAge(cd *capstanv1.ClusterDeployment) time.Duration {
	if requested, _ := pendingRequest(cd); requested != "" {
		return 0
	}
	return interval(cd) / revisionShare
}

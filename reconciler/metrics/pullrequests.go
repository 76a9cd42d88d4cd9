package metrics

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// PullRequestReportFailures names the family of failed forge requests of
// the pull request watcher (docs/metrics.md).
const PullRequestReportFailures = Prefix + "pullrequest_report_failures_total"

// PullRequestPlans names the family of plans of pull request heads
// (docs/metrics.md).
const PullRequestPlans = Prefix + "pullrequest_plans_total"

// Why a pull request head was planned (PullRequestPlans' reason label).
const (
	PlanReasonHead       = "head"       // a head not planned yet: a new pull request, a push, a restart
	PlanReasonRollout    = "rollout"    // a rollout of the branch settled since the last plan
	PlanReasonUnanswered = "unanswered" // a cluster of the last plan did not answer
	PlanReasonMembers    = "members"    // deployments reading the branch came or went
)

// PullRequestCollector holds the pull request watcher's families. Its
// methods are safe for concurrent use, and on a nil collector do nothing.
type PullRequestCollector struct {
	failures *prometheus.CounterVec
	plans    *prometheus.CounterVec
}

var (
	pullRequestMu     sync.Mutex
	pullRequestShared = map[prometheus.Registerer]*PullRequestCollector{}
)

// PullRequestFor returns the pull request collector registered on reg,
// registering one the first time (like For); nil for a nil reg.
func PullRequestFor(reg prometheus.Registerer) (*PullRequestCollector, error) {
	if reg == nil {
		return nil, nil
	}
	pullRequestMu.Lock()
	defer pullRequestMu.Unlock()
	if c, ok := pullRequestShared[reg]; ok {
		return c, nil
	}
	c := &PullRequestCollector{
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: PullRequestReportFailures,
			Help: "Forge requests of the pull request watcher that failed (listing pull requests, writing or reading back a comment, writing a commit status, finding the pull request of a commit, reading the token), by forge and reason: unauthorized, forbidden, not_found, rate_limited, server_error, unreachable, rejected, token.",
		}, []string{"forge", "reason"}),
		plans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: PullRequestPlans,
			Help: "Plans of pull request heads (a fetch, a render and a dry run per deployment reading the branch), by reason: head (not planned yet), rollout (a rollout of the branch settled since), unanswered (a cluster did not answer), members (deployments came or went).",
		}, []string{"reason"}),
	}
	for _, col := range []prometheus.Collector{c.failures, c.plans} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("register Capstan pull request metrics: %w", err)
		}
	}
	pullRequestShared[reg] = c
	return c, nil
}

// Failure counts one failed forge request.
func (c *PullRequestCollector) Failure(forge, reason string) {
	if c != nil {
		c.failures.WithLabelValues(forge, reason).Inc()
	}
}

// Planned counts one plan of a pull request head, for reason.
func (c *PullRequestCollector) Planned(reason string) {
	if c != nil {
		c.plans.WithLabelValues(reason).Inc()
	}
}

package report

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capstan-dev/capstan/sources/git"
)

// Options configure a Reporter.
type Options struct {
	// AuthorName and AuthorEmail sign status commits (author and
	// committer).
	AuthorName, AuthorEmail string
	// Interval is the coalescing window of deployments whose
	// spec.report.gitStatus sets none: at most one commit per deployment
	// per Interval.
	Interval time.Duration
	// Settle is how long the first change of a deployment waits for more
	// before it is committed, so that the burst of one reconcile and
	// other deployments of the repository join the same commit. It never
	// exceeds Interval.
	Settle time.Duration
	// RetryBase and RetryMax bound the backoff after a failed commit.
	RetryBase, RetryMax time.Duration
	// PushTimeout bounds one commit: listing, fetching, pushing and the
	// retries after lost races.
	PushTimeout time.Duration
	// PushRetries is how many times a push that lost a race (the branch
	// moved meanwhile) is rebuilt on the new tip and tried again.
	PushRetries int
	// Workers is how many repositories are pushed to at once.
	Workers int
	// Root is the daemon's root source, for deployments that read it.
	Root *Root
	// Resume makes Start first look at every ClusterDeployment, so that a
	// status the previous leader wrote but had no time to commit is
	// committed (a file the branch already holds costs one fetch per
	// repository and no commit). Off when each replica reports only its
	// share of the deployments (sharding).
	Resume bool
	// Registerer receives the report metrics; nil registers none.
	Registerer prometheus.Registerer
	// Now returns the current time (tests).
	Now func() time.Time
}

// Root is the daemon's root source as status commits see it.
type Root struct {
	// URL and Branch are what the root source reads; URL is empty for a
	// root that is not a git repository (a directory).
	URL, Branch string
	// Auth are the root source's credentials, used for its status commits.
	Auth git.Auth
	// StatusBranch, when set, makes every deployment that reads the root
	// source and sets no spec.report commit its status to this branch of
	// the root repository (`capstan run --status-branch`). It is the
	// only branch status commits with the root's credentials go to.
	StatusBranch string
	// Namespaces are those whose deployments the root source serves
	// (Capstan's, and `capstan run --root-source-namespaces`): only their
	// status is committed with the root's credentials.
	Namespaces []string
}

// serves reports whether the root's credentials may commit the status of
// a deployment of namespace ns.
func (r *Root) serves(ns string) bool {
	return r != nil && slices.Contains(r.Namespaces, ns)
}

// DefaultOptions returns the options `capstan run` starts with.
func DefaultOptions() Options {
	return Options{
		AuthorName:  "Capstan",
		AuthorEmail: "capstan@localhost",
		Interval:    30 * time.Second,
		Settle:      time.Second,
		RetryBase:   time.Second,
		RetryMax:    5 * time.Minute,
		PushTimeout: 2 * time.Minute,
		PushRetries: 5,
		Workers:     4,
		Now:         time.Now,
	}
}

// withDefaults fills the zero fields of o from DefaultOptions.
func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.AuthorName == "" {
		o.AuthorName = d.AuthorName
	}
	if o.AuthorEmail == "" {
		o.AuthorEmail = d.AuthorEmail
	}
	if o.Interval <= 0 {
		o.Interval = d.Interval
	}
	if o.Settle <= 0 {
		o.Settle = d.Settle
	}
	if o.RetryBase <= 0 {
		o.RetryBase = d.RetryBase
	}
	if o.RetryMax <= 0 {
		o.RetryMax = d.RetryMax
	}
	if o.PushTimeout <= 0 {
		o.PushTimeout = d.PushTimeout
	}
	if o.PushRetries <= 0 {
		o.PushRetries = d.PushRetries
	}
	if o.Workers <= 0 {
		o.Workers = d.Workers
	}
	if o.Now == nil {
		o.Now = d.Now
	}
	return o
}

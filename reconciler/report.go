package reconciler

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/report"
	"github.com/capstan-dev/capstan/sources/git"
)

// statusNotifier is told of every status the reconciler writes;
// reconciler/report commits it to the deployment's status branch. Notify
// must not block.
type statusNotifier interface {
	Notify(cd *capstanv1.ClusterDeployment)
}

var _ statusNotifier = (*report.Reporter)(nil)

// notifyStatus hands a status just written to the notifier, if any.
func (r *Reconciler) notifyStatus(cd *capstanv1.ClusterDeployment) {
	if r.report != nil {
		r.report.Notify(cd)
	}
}

// ReportOptions configure status commits (docs/report.md). A deployment
// with spec.report.gitStatus reports whatever these say; these add the
// default for the root source and the commits' author.
type ReportOptions struct {
	// StatusBranch, when set, makes every deployment that reads the root
	// source and sets no spec.report commit its status to this branch of
	// the root repository.
	StatusBranch string
	// Interval is the coalescing window of deployments that set none;
	// zero means 30s.
	Interval time.Duration
	// AuthorName and AuthorEmail sign status commits; empty means
	// "Capstan" and "capstan@localhost".
	AuthorName, AuthorEmail string
	// ForgeTransport, when set, carries the pull request watcher's
	// requests to forges (the e2e tests count and break them) as it is:
	// the ca.crt of a token Secret is not added to it. nil means a
	// transport that trusts the system roots and that ca.crt.
	ForgeTransport http.RoundTripper
}

// addReporter builds the runnable that makes status commits and hands it
// the statuses the reconciler writes.
func addReporter(opts Options, mgr manager.Manager, reg prometheus.Registerer, r *Reconciler, shard *sharding) error {
	ro := report.DefaultOptions()
	ro.Registerer = reg
	// Sharded, a replica sees its share of the deployments only through
	// the statuses it writes.
	ro.Resume = shard == nil
	if opts.Report.Interval > 0 {
		ro.Interval = opts.Report.Interval
	}
	if opts.Report.AuthorName != "" {
		ro.AuthorName = opts.Report.AuthorName
	}
	if opts.Report.AuthorEmail != "" {
		ro.AuthorEmail = opts.Report.AuthorEmail
	}
	ro.Root = reportRoot(opts)
	if ro.Root == nil && opts.Report.StatusBranch != "" {
		return fmt.Errorf("status commits: a status branch (%s) is set but the daemon has no root source", opts.Report.StatusBranch)
	}
	rep, err := report.New(ro, mgr.GetClient(), shard.recorder(mgr.GetEventRecorder("capstan")))
	if err != nil {
		return err
	}
	if err := mgr.Add(shard.everyReplica(rep)); err != nil {
		return fmt.Errorf("add status commits: %w", err)
	}
	r.report = rep
	return nil
}

// reportRoot is the daemon's root source as reports see it; nil without
// one. Its URL is empty when the root is not a git repository.
func reportRoot(opts Options) *report.Root {
	root := opts.Root
	if root == nil {
		return nil
	}
	out := &report.Root{Branch: root.Branch, Auth: root.Auth, StatusBranch: opts.Report.StatusBranch,
		Namespaces: slices.Sorted(maps.Keys(rootNamespacesOf(*root, opts.LeaderElection.homeNamespace())))}
	if _, isGit := root.Source.(*git.Source); (root.Source == nil || isGit) && !strings.HasPrefix(root.URL, "dir://") {
		out.URL = root.URL
	}
	return out
}

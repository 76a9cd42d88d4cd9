package report

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
	"github.com/capstan-dev/capstan/stages"
)

// Planner plans the head of a pull request for one deployment: it fetches
// ref (the pull request's HeadFetchRef) with the deployment's git
// credentials, renders the deployment's path, builds its plan and
// dry-runs it against the live cluster. The reconciler implements it.
type Planner interface {
	// PlanHead returns the plan, or in PlanResult.Err why the revision
	// cannot be applied (render, plan and validation errors, which go in
	// the comment). The error is for what a later try may get past (the
	// fetch failed, the cluster did not answer): nothing is commented.
	// decrypt says whether sops-encrypted files may be decrypted for this
	// pull request: not for a fork whose author the forge does not name
	// trusted (gateMember), who could route a decrypted value into what
	// the plan shows.
	PlanHead(ctx context.Context, cd *capstanv1.ClusterDeployment, ref string, decrypt bool) (PlanResult, error)
}

// PlanResult is the plan of a pull request's head for one deployment.
type PlanResult struct {
	// Revision is the revision planned, e.g. refs/pull/7/head@sha1:4f2c....
	Revision string
	// Diff is the dry run against the live cluster; nil when Err is set.
	Diff *stages.PlanDiff
	// Err says why the revision cannot be applied.
	Err error
	// Secrets are the data of further Secrets whose values must not reach
	// the comment (the source's credentials).
	Secrets []map[string][]byte
}

// PullRequestOptions configure a PullRequests watcher.
type PullRequestOptions struct {
	// Root is the daemon's root source, for deployments that read it.
	Root *Root
	// Interval is the coalescing window of the rollout: at most one edit
	// of a comment, and one commit status per deployment, per Interval.
	Interval time.Duration
	// Owns reports whether this replica handles the pull requests of a
	// repository and branch (a group key); nil means all of them.
	// Sharded, every replica runs a watcher and the owner of a group's
	// key handles it, so that one comment has one writer.
	Owns func(group string) bool
	// NewForge builds a forge client; nil means forge.New.
	NewForge func(forge.Config) (forge.Forge, error)
	// Events receives a Warning event on the deployments concerned when a
	// forge request fails in a new way, and a Normal one when it works
	// again; nil means none. Sharded, it must not drop events about
	// deployments other replicas reconcile: the group's owner tells them.
	Events recorder.EventRecorder
	// Registerer receives capstan_pullrequest_report_failures_total; nil
	// means no metrics.
	Registerer prometheus.Registerer
	// Logger receives the watcher's logs; unset means the one of the
	// context Start is given.
	Logger logr.Logger
	// Now returns the current time (tests).
	Now func() time.Time
}

// maxKnownPullRequests bounds what a group remembers of pull requests
// that are no longer open (their plan, for the rollout that follows a
// merge) and of commits looked up.
const maxKnownPullRequests = 256

// maxCommitLookups is how many times the forge is asked for the pull
// request of a revision before it is taken for a commit that came from
// none.
const maxCommitLookups = 5

// tokenTTL is how long a forge token is used before its Secret is read
// again (at once when the forge refuses it).
const tokenTTL = 5 * time.Minute

// PullRequests keeps one comment per open pull request against the branch
// a deployment with spec.report.pullRequests reads: the plan of its head
// for every such deployment, as a server-side dry run, planned once per
// head commit. Once a merged revision rolls out, the same comment gets the
// rollout's stage table and the commit gets a commit status, at most once
// per Interval, until Ready (success) or stuck or stalled (failure). It
// reads deployments from the informer cache; Notify only wakes it.
type PullRequests struct {
	opts    PullRequestOptions
	client  client.Reader
	planner Planner
	metrics *metrics.PullRequestCollector

	wake chan struct{}

	mu     sync.Mutex
	groups map[string]*groupState
	// complained remembers the configuration problem last logged per
	// deployment, so that it is logged once.
	complained map[types.NamespacedName]string
}

var (
	_ manager.Runnable               = (*PullRequests)(nil)
	_ manager.LeaderElectionRunnable = (*PullRequests)(nil)
)

// NewPullRequests returns a watcher that reads deployments and Secrets
// through c and plans through p.
func NewPullRequests(opts PullRequestOptions, c client.Reader, p Planner) (*PullRequests, error) {
	if opts.Interval <= 0 {
		opts.Interval = DefaultOptions().Interval
	}
	if opts.NewForge == nil {
		opts.NewForge = forge.New
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m, err := metrics.PullRequestFor(opts.Registerer)
	if err != nil {
		return nil, err
	}
	return &PullRequests{
		opts: opts, client: c, planner: p, metrics: m, wake: make(chan struct{}, 1),
		groups: map[string]*groupState{}, complained: map[types.NamespacedName]string{},
	}, nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: only the
// replica that reconciles comments. Sharded, the daemon runs it on every
// replica and Owns splits the work.
func (w *PullRequests) NeedLeaderElection() bool { return true }

// Notify implements the reconciler's status notifier: a deployment with
// pull requests changed its status, so its rollout may have moved. It
// never blocks.
func (w *PullRequests) Notify(cd *capstanv1.ClusterDeployment) {
	if w == nil || cd.Spec.Report == nil || cd.Spec.Report.PullRequests == nil {
		return
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Start watches until ctx ends.
func (w *PullRequests) Start(ctx context.Context) error {
	logger := w.opts.Logger
	if logger.GetSink() == nil {
		logger = log.FromContext(ctx)
	}
	ctx = log.IntoContext(ctx, logger.WithName("pull-requests"))
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
		case <-timer.C:
		}
		next := w.round(ctx)
		// Sharded, the statuses of a group's deployments may be written by
		// other replicas, whose Notify does not reach this one: look at
		// least once per window.
		wait := min(max(next.Sub(w.opts.Now()), 10*time.Millisecond), w.opts.Interval)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// group is the deployments that read one branch of one repository of one
// forge: they share the listing of its pull requests and its comments.
type group struct {
	key      string
	cfg      forge.Config // without the token
	repo     string
	branch   string
	interval time.Duration
	members  []*capstanv1.ClusterDeployment // sorted by namespace/name
}

// groupState is what the watcher remembers of a group between rounds.
type groupState struct {
	nextList time.Time
	// planned maps each open pull request to what it was planned against
	// (or told it was not planned).
	planned map[int64]plannedHead
	// waiting holds when each open pull request whose head is due to be
	// planned began to wait: the queue's order.
	waiting map[int64]time.Time
	prs     map[int64]*prState
	// rollouts follows each member's revision.
	rollouts map[types.NamespacedName]*rolloutState
	// commits caches the pull request each commit came from (0: none).
	commits map[string]int64

	forge     forge.Forge
	token     string
	tokenRead time.Time
	tokenFrom types.NamespacedName
	// failing holds, per operation, the reason it last failed with, until
	// it works again: a failure that repeats is not logged again.
	failing map[string]string
}

// prState is one pull request's comment.
type prState struct {
	pr forge.PullRequest
	// plan is the body of the plan, without the marker line; empty when
	// Capstan has not planned it since it started, until it is read back
	// from the comment (read). A pull request not planned, or queued, has
	// the note that says so in its place.
	plan string
	// queued is set while plan is the note that the head is queued.
	queued  bool
	secrets []map[string][]byte
	// read is set once the comment was read back for a plan this process
	// did not make, found or not; missing is what stands in the plan's
	// place when the comment held none to take back.
	read    bool
	missing string
	// sent is the last body the comment was given, sentAt when.
	sent   string
	sentAt time.Time
	url    string
	seen   time.Time
	// sections holds the rollout of each deployment that deployed the
	// pull request's commit, frozen once it moves on to another;
	// rawRollout is their text before and rollout after scrubbing.
	sections            map[types.NamespacedName]string
	rawRollout, rollout string
}

// rolloutState follows one deployment's revision.
type rolloutState struct {
	sha string
	// looked is set once the pull request is known (pr; 0 for none);
	// until then the forge is asked at lookAt, lookups times so far.
	looked  bool
	pr      int64
	lookAt  time.Time
	lookups int
	// status is the last commit status set (state and description).
	status   string
	statusAt time.Time
}

// round looks at every group this replica handles and returns when it
// next has something to do.
func (w *PullRequests) round(ctx context.Context) time.Time {
	now := w.opts.Now()
	next := now.Add(w.opts.Interval)
	groups, err := w.listGroups(ctx)
	if err != nil {
		log.FromContext(ctx).Error(err, "list ClusterDeployments to watch their pull requests")
		return next
	}
	live := map[string]bool{}
	for _, g := range groups {
		if w.opts.Owns != nil && !w.opts.Owns(g.key) {
			// Forgotten: should the group come back to this replica,
			// what it remembers would be stale (another replica wrote
			// meanwhile); the comment on the forge is the truth.
			continue
		}
		live[g.key] = true
		w.mu.Lock()
		st := w.groups[g.key]
		if st == nil {
			st = &groupState{planned: map[int64]plannedHead{}, waiting: map[int64]time.Time{}, prs: map[int64]*prState{},
				rollouts: map[types.NamespacedName]*rolloutState{}, commits: map[string]int64{}, failing: map[string]string{}}
			w.groups[g.key] = st
		}
		w.mu.Unlock()
		if t := w.serve(ctx, g, st); t.Before(next) {
			next = t
		}
	}
	w.mu.Lock()
	for k := range w.groups {
		if !live[k] {
			delete(w.groups, k)
		}
	}
	w.mu.Unlock()
	return next
}

// serve does what is due in one group and returns when it next has
// something to do.
func (w *PullRequests) serve(ctx context.Context, g *group, st *groupState) time.Time {
	logger := log.FromContext(ctx).WithValues("repository", g.repo, "branch", g.branch)
	ctx = log.IntoContext(ctx, logger)
	now := w.opts.Now()
	f, err := w.forgeOf(ctx, g, st, now)
	if err = w.outcome(ctx, g, st, opToken, g.members, err); err != nil {
		return now.Add(g.interval)
	}
	if !now.Before(st.nextList) {
		st.nextList = now.Add(g.interval)
		if err := unreported(w.planOpen(ctx, g, st, f)); err != nil {
			logger.Error(err, "plan the open pull requests; trying again at the next interval")
		}
	}
	next := st.nextList
	if t := w.followRollouts(ctx, g, st, f); !t.IsZero() && t.Before(next) {
		next = t
	}
	return next
}

// forgeOf returns the group's forge client, reading the token (and the CA
// of a forge with a private one) of its first member again once tokenTTL
// has passed.
func (w *PullRequests) forgeOf(ctx context.Context, g *group, st *groupState, now time.Time) (forge.Forge, error) {
	cd := g.members[0]
	secret := types.NamespacedName{Namespace: cd.Namespace, Name: cd.Spec.Report.PullRequests.SecretRef.Name}
	if st.forge != nil && st.tokenFrom == secret && now.Sub(st.tokenRead) < tokenTTL {
		return st.forge, nil
	}
	creds, err := forge.ReadCredentials(ctx, w.client, secret, capstanv1.DefaultForgeTokenKey)
	if err != nil {
		return nil, fmt.Errorf("ClusterDeployment %s/%s: spec.report.pullRequests.secretRef: %w", cd.Namespace, cd.Name, err)
	}
	f, err := w.opts.NewForge(creds.Apply(g.cfg))
	if err != nil {
		return nil, fmt.Errorf("ClusterDeployment %s/%s: spec.report.pullRequests: %w", cd.Namespace, cd.Name, err)
	}
	st.forge, st.token, st.tokenRead, st.tokenFrom = f, creds.Token, now, secret
	return f, nil
}

// forgeFailed makes the next round read the token again when the forge
// refused it.
func (w *PullRequests) forgeFailed(st *groupState, err error) {
	var fe *forge.Error
	if errors.As(err, &fe) && (fe.StatusCode == http.StatusUnauthorized || fe.StatusCode == http.StatusForbidden) {
		st.forge = nil
	}
}

// upsert gives pull request n's comment its body: the rollouts of the
// members that deploy it, then its plan.
func (w *PullRequests) upsert(ctx context.Context, g *group, st *groupState, f forge.Forge, n int64) error {
	ps := st.prs[n]
	body, err := w.commentBody(ctx, g, st, n)
	if err != nil {
		return err
	}
	if body == ps.sent {
		return nil
	}
	c, err := owned(w, g, func() (forge.Comment, error) { return f.UpsertComment(ctx, g.repo, n, PlanMarkerKey, body) })
	if err = w.outcome(ctx, g, st, opComment, g.members, err); err != nil {
		return err
	}
	ps.sent, ps.sentAt, ps.url = body, w.opts.Now(), c.URL
	log.FromContext(ctx).V(1).Info("pull request comment kept", "pullRequest", n, "action", c.Action)
	return nil
}

// owned makes a forge write unless sharding gave the group to another
// replica since the round began: a round may outlast a handover (a slow
// plan), and one comment has one writer.
func owned[T any](w *PullRequests, g *group, write func() (T, error)) (T, error) {
	if w.opts.Owns != nil && !w.opts.Owns(g.key) {
		var zero T
		return zero, errHandedOver
	}
	return write()
}

// evict bounds what a group remembers of pull requests that are no
// longer open and of commits looked up.
func (st *groupState) evict() {
	if len(st.prs) > maxKnownPullRequests {
		var old []int64
		for n := range st.prs {
			_, planned := st.planned[n]
			_, waiting := st.waiting[n]
			if !planned && !waiting {
				old = append(old, n)
			}
		}
		slices.SortFunc(old, func(a, b int64) int { return st.prs[a].seen.Compare(st.prs[b].seen) })
		for _, n := range old[:max(0, min(len(old), len(st.prs)-maxKnownPullRequests))] {
			delete(st.prs, n)
		}
	}
	if len(st.commits) > maxKnownPullRequests {
		clear(st.commits)
	}
}

package reconciler

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/report"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/sources/git"
	"github.com/capstan-dev/capstan/stages"
)

// pullRequestShard is the namespace of the keys that decide, when
// sharding, which replica handles the pull requests of a repository and
// branch: the owner of that key, as for a deployment of that name.
const pullRequestShard = "capstan.dev/pull-requests"

// PullRequestOwner returns the replica of replicas that handles the pull
// requests of group (report.PullRequestGroup) when sharding.
func PullRequestOwner(group string, replicas []string) string {
	return ShardOwner(pullRequestShard, group, replicas)
}

// ownsPullRequests reports whether this replica handles the pull
// requests of group now. As with a deployment's claim, it writes only
// while its own membership Lease was renewed less than half a duration
// ago by its clock: a replica cut off from the API server stops
// commenting before the others take its groups over.
func (s *sharding) ownsPullRequests(group string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ownsLocked(types.NamespacedName{Namespace: pullRequestShard, Name: group}) &&
		s.now().Sub(s.renewed) < s.opts.LeaseDuration/2
}

// addPullRequests builds the runnable that keeps the plan comments on pull
// requests and follows merged revisions (docs/pull-requests.md), and hands
// it the statuses the reconciler writes, beside the status commits.
func addPullRequests(opts Options, mgr manager.Manager, reg prometheus.Registerer, r *Reconciler, shard *sharding) error {
	po := report.PullRequestOptions{
		Root: reportRoot(opts), Interval: opts.Report.Interval, Registerer: reg, Logger: mgr.GetLogger(),
		// Not the sharded recorder: the owner of a repository's pull
		// requests tells every deployment of it, whoever reconciles them.
		Events: mgr.GetEventRecorder("capstan"),
	}
	if t := opts.Report.ForgeTransport; t != nil {
		po.NewForge = func(cfg forge.Config) (forge.Forge, error) {
			cfg.HTTPClient = &http.Client{Transport: t, Timeout: 30 * time.Second}
			return forge.New(cfg)
		}
	}
	if shard != nil {
		// Every replica runs a watcher; the owner of a group's key
		// handles it, so that each comment has one writer. It reads every
		// member of the group, whichever replica reconciles it: the plans
		// are dry runs, the rollouts come from the statuses in the cache.
		po.Owns = shard.ownsPullRequests
	}
	planner := &prPlanner{r: r}
	if root := po.Root; root != nil {
		planner.rootURL, planner.rootAuth = root.URL, root.Auth
	}
	w, err := report.NewPullRequests(po, mgr.GetClient(), planner)
	if err != nil {
		return fmt.Errorf("pull request comments: %w", err)
	}
	if err := mgr.Add(shard.everyReplica(w)); err != nil {
		return fmt.Errorf("add pull request comments: %w", err)
	}
	r.report = notifiers{r.report, w}
	return nil
}

// notifiers hands a status to each of several notifiers.
type notifiers []statusNotifier

func (ns notifiers) Notify(cd *capstanv1.ClusterDeployment) {
	for _, n := range ns {
		if n != nil {
			n.Notify(cd)
		}
	}
}

// prPlanner plans pull request heads for the watcher, with the daemon's
// sources, limits and connections.
type prPlanner struct {
	r        *Reconciler
	rootURL  string
	rootAuth git.Auth
}

var _ report.Planner = (*prPlanner)(nil)

// PlanHead implements report.Planner: it fetches ref with the
// deployment's git credentials into the artifact cache, renders and plans
// it as a reconcile would (within the daemon's render limits and slots),
// and dry-runs the plan against the deployment's cluster.
func (p *prPlanner) PlanHead(ctx context.Context, cd *capstanv1.ClusterDeployment, ref string, decrypt bool) (report.PlanResult, error) {
	var res report.PlanResult
	c := p.r.sources
	in := RefFetch{Ref: ref, Limits: c.limits, CacheDir: c.store.Dir()}
	switch src := cd.Spec.Source; {
	case src != nil && src.Git != nil:
		in.URL = src.Git.URL
		if sr := src.Git.SecretRef; sr != nil {
			secret, err := p.r.readSecret(ctx, cd, "spec.source.git.secretRef", sr.Name)
			if err != nil {
				return res, err
			}
			res.Secrets = append(res.Secrets, secret.Data)
			if in.Auth, err = GitAuth(secret); err != nil {
				return res, err
			}
			in.Secret = cd.Namespace + "/" + sr.Name
		}
	case src == nil && p.rootURL != "" && !p.r.sources.rootServes(cd.Namespace):
		// Nothing of the root repository is read for a deployment the
		// root source does not serve (docs/root-source.md).
		res.Err = p.r.sources.notServed(cd.Namespace)
		return res, nil
	case src == nil && p.rootURL != "":
		in.URL, in.Auth = p.rootURL, p.rootAuth
	default:
		return res, errors.New("the deployment reads no git repository")
	}
	art, err := FetchRef(ctx, in)
	if err != nil {
		return res, err
	}
	defer art.Remove()
	res.Revision = art.Revision

	plan, err := p.plan(ctx, cd, art.FS, decrypt)
	if err != nil {
		if ctx.Err() != nil {
			return res, err
		}
		res.Err = err
		return res, nil
	}
	// Each stage is compared with the cluster it acts on. A cluster that
	// stops answering during the dry run is DiffPlan's error
	// (stages.IsUnreachable), never a plan whose objects all fail: nothing
	// is commented, and the head is planned again later. Only the
	// deployment's own cluster stops it so: another one leaves its stages
	// not compared, and says so.
	home, err := p.r.local(cd)
	if err != nil {
		return res, err
	}
	differ := clusterDiffer{home: home, clusters: p.r.clusters}
	d, err := differ.diff(ctx, cd, plan, DiffOptionsFor(cd.Spec, cd))
	if err != nil {
		if stages.IsStalled(err) {
			res.Err = err
			return res, nil
		}
		return res, fmt.Errorf("dry run against the cluster: %w", err)
	}
	res.Diff = d
	return res, nil
}

// plan renders and plans a fetched tree within the daemon's limits and
// render slots, with the bootstrap key substituted and the sops files
// decrypted as a reconcile does.
func (p *prPlanner) plan(ctx context.Context, cd *capstanv1.ClusterDeployment, fsys fs.FS, decrypt bool) (*stages.Plan, error) {
	c := p.r.sources
	opts := render.DefaultOptions()
	opts.MaxFileBytes, opts.MaxBytes, opts.MaxObjects = c.opts.MaxFileBytes, c.opts.MaxRenderBytes, c.opts.MaxObjects
	key, err := p.r.bootstrapKey(ctx, cd)
	if err != nil {
		return nil, err
	}
	if key != "" {
		opts.Substitute = map[string]string{stages.BootstrapKeyVar: key}
	}
	// Encrypted files are decrypted as a reconcile decrypts them, in
	// memory: else the dry run sees ciphertext and every encrypted
	// object becomes a problem of the plan. What keeps the plaintext out
	// of the comment is the diff's: a decrypted object's values are
	// hidden whatever its kind, and every decrypted value is scrubbed
	// from the text, a copy in another object's field included
	// (docs/secrets.md, Pull requests). A key Secret that is missing is
	// the plan's error, as it would stall the merge.
	//
	// A fork whose author the forge does not name trusted, planned because
	// of forks: plan, gets no key (report.Planner): its files could route
	// a decrypted value anywhere the plan shows, and the scrub misses
	// short ones. Its encrypted files are the plan's error, saying so.
	if !decrypt {
		opts.Decrypt = &render.Keys{}
	} else if opts.Decrypt, err = p.r.decryptionKeys(ctx, cd); err != nil {
		return nil, err
	}
	select {
	case c.renders <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-c.renders }()
	plan, err := PlanTree(ctx, PlanInput{FS: fsys, Spec: cd.Spec, Live: cd, Render: opts})
	if de := (*render.DecryptError)(nil); !decrypt && errors.As(err, &de) {
		return nil, fmt.Errorf("%w: %w", errForkNotDecrypted, err)
	}
	return plan, err
}

// errForkNotDecrypted heads the plan error of a fork planned without the
// decryption keys.
var errForkNotDecrypted = errors.New("encrypted files are not decrypted for a pull request from a fork whose author the forge does not name " +
	"the repository's owner, a member or a collaborator (forks: plan plans it without the keys); a maintainer can push its branch to this repository to have it planned with them")

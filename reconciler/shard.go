package reconciler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/stages"
)

// ShardingOptions configure sharding (docs/sharding.md): every replica
// acts, each on the ClusterDeployments that rendezvous hashing over the
// live replicas gives it. A replica is live while its membership Lease
// capstan-replica-<identity> is renewed; a deployment is written for only
// by the replica holding its claim, the Lease capstan-claim.<name> in the
// deployment's namespace.
type ShardingOptions struct {
	// Enabled turns sharding on. The ClusterDeployment controller and the
	// drift watcher then run on every replica; leader election, when on,
	// still picks the one replica that runs the root source.
	Enabled bool
	// Namespace holds the membership Leases; empty means the leader
	// election's (the pod's namespace, else capstan-system).
	Namespace string
	// Group names the replicas that share the deployments: the value of
	// the capstan.dev/replica-of label on their Leases.
	Group string
	// Identity names this replica; empty means $POD_NAME, stable across a
	// container's restarts, else the daemon's identity.
	Identity string
	// LeaseDuration is how long a replica stays live after its last
	// renewal, and how long a claim holds after its last renewal;
	// RenewPeriod is how often a replica renews its Lease and looks at
	// the others'. RenewPeriod must be at most a third of LeaseDuration.
	LeaseDuration, RenewPeriod time.Duration
}

// DefaultShardingOptions returns the timings `capstan run --sharding`
// starts with.
func DefaultShardingOptions() ShardingOptions {
	return ShardingOptions{Group: "capstan", LeaseDuration: 15 * time.Second, RenewPeriod: 5 * time.Second}
}

func (o ShardingOptions) withDefaults() ShardingOptions {
	d := DefaultShardingOptions()
	if o.Group == "" {
		o.Group = d.Group
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = d.LeaseDuration
	}
	if o.RenewPeriod == 0 {
		o.RenewPeriod = min(d.RenewPeriod, o.LeaseDuration/3)
	}
	if o.Namespace == "" {
		o.Namespace = LeaderElectionOptions{}.namespace()
	}
	return o
}

func (o ShardingOptions) validate() error {
	var errs []error
	if o.LeaseDuration < time.Second || o.LeaseDuration%time.Second != 0 {
		errs = append(errs, fmt.Errorf("sharding lease duration %s: want whole seconds, at least 1s (a Lease counts seconds)", o.LeaseDuration))
	}
	if o.RenewPeriod <= 0 || o.RenewPeriod*3 > o.LeaseDuration {
		errs = append(errs, fmt.Errorf("sharding renew period %s: want more than 0 and at most a third of the lease duration %s", o.RenewPeriod, o.LeaseDuration))
	}
	return errors.Join(errs...)
}

// Labels and names of the sharding Leases.
const (
	// ReplicaLabel on a membership Lease names its group.
	ReplicaLabel = "capstan.dev/replica-of"
	// ClaimLabel on a claim Lease names its deployment.
	ClaimLabel = "capstan.dev/claim-of"

	replicaLeasePrefix = "capstan-replica-"
	claimLeasePrefix   = "capstan-claim."
)

// ShardOwner returns the replica of replicas that owns the deployment
// namespace/name: the one with the highest rendezvous weight, so that a
// replica joining or leaving moves only the deployments it takes or
// leaves; "" without replicas.
func ShardOwner(namespace, name string, replicas []string) string {
	key := namespace + "/" + name
	best, bestWeight := "", uint64(0)
	for _, r := range replicas {
		w := rendezvousWeight(r, key)
		if best == "" || w > bestWeight || (w == bestWeight && r < best) {
			best, bestWeight = r, w
		}
	}
	return best
}

// rendezvousWeight is FNV-1a of replica and key, finished by splitmix64's
// mixer so that the high bits, which decide, depend on every input bit.
func rendezvousWeight(replica, key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(replica))
	h.Write([]byte{0})
	h.Write([]byte(key))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// ReplicaLeaseName is the membership Lease of the replica identity: a DNS
// subdomain whatever the identity holds; identities that differ get
// different names.
func ReplicaLeaseName(identity string) string {
	return leaseName(replicaLeasePrefix, identity)
}

// ClaimLeaseName is the claim Lease of the deployment name, in the
// deployment's namespace.
func ClaimLeaseName(deployment string) string {
	return leaseName(claimLeasePrefix, deployment)
}

func leaseName(prefix, s string) string {
	clean := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '-'
	}, s)
	clean = strings.Trim(clean, "-.")
	name := prefix + clean
	if clean == s && len(name) <= 253 {
		return name
	}
	// Changed or too long: a hash of the original keeps it apart from
	// every other.
	sum := sha256.Sum256([]byte(s))
	suffix := "-" + hex.EncodeToString(sum[:8])
	return strings.TrimRight(name[:min(len(name), 253-len(suffix))], "-.") + suffix
}

// shardIdentity is the replica's name in its Lease and in the claims.
func shardIdentity(o ShardingOptions, daemonIdentity string) string {
	if o.Identity != "" {
		return o.Identity
	}
	if pod := os.Getenv("POD_NAME"); pod != "" {
		return pod
	}
	return daemonIdentity
}

// sharding is one replica's part in a sharded group: its membership
// (shard_members.go), its claims (shard_claims.go), and the gate in front
// of the reconciler that lets through only the deployments it owns. A nil
// *sharding is sharding off: its wiring methods hand back what they are
// given.
type sharding struct {
	opts ShardingOptions
	id   string
	// leases reads and writes Leases directly: claims must be read from
	// the API server, never from a cache.
	leases client.Client
	// cache reads the deployments from the informer cache.
	cache   client.Reader
	metrics *metrics.ShardCollector
	now     func() time.Time

	// Set by register.
	next    reconcile.Reconciler
	forget  func(namespace, name string)
	enqueue chan<- event.GenericEvent

	mu sync.Mutex
	// members are the live replicas, sorted, this one included while its
	// own Lease is renewed; empty before the first look.
	members []string
	// seen are the membership Leases of the group last listed.
	seen []coordinationv1.Lease
	// own is this replica's Lease as last written; renewed is the local
	// time just before that write.
	own      *coordinationv1.Lease
	renewed  time.Time
	stopping bool
	// inflight holds the reconciles in progress, one per deployment at
	// most (the controller's queue sees to that).
	inflight map[types.NamespacedName]*running
	idle     *sync.Cond
	claims   map[types.NamespacedName]*heldClaim
}

// running is a reconcile in progress: cancel stops it, done is closed
// when its keepalive has returned.
type running struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// newSharding returns the daemon's part in a sharded group, nil when
// sharding is off.
func newSharding(o ShardingOptions, daemonIdentity string, mgr manager.Manager, reg prometheus.Registerer) (*sharding, error) {
	if !o.Enabled {
		return nil, nil
	}
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return nil, err
	}
	m, err := metrics.ShardFor(reg)
	if err != nil {
		return nil, err
	}
	// A client of its own, like leader election's: renewals must not
	// queue behind a large apply in the shared client's rate limiter.
	leases, err := client.New(rest.AddUserAgent(rest.CopyConfig(mgr.GetConfig()), "sharding"),
		client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return nil, fmt.Errorf("sharding client: %w", err)
	}
	s := &sharding{
		opts: o, id: shardIdentity(o, daemonIdentity), leases: leases, cache: mgr.GetClient(),
		metrics: m, now: time.Now,
		inflight: map[types.NamespacedName]*running{},
		claims:   map[types.NamespacedName]*heldClaim{},
	}
	s.idle = sync.NewCond(&s.mu)
	return s, nil
}

// executorOptions make the executor check the claim before every write.
func (s *sharding) executorOptions() []stages.ExecutorOption {
	if s == nil {
		return nil
	}
	return []stages.ExecutorOption{stages.WithClaim(func(ctx context.Context, o stages.Owner) error {
		return s.hold(ctx, types.NamespacedName{Namespace: o.Namespace, Name: o.Name})
	})}
}

// client wraps the reconciler's client: a write of a ClusterDeployment
// (its status, its finalizer) needs its claim.
func (s *sharding) client(c client.Client) client.Client {
	if s == nil {
		return c
	}
	return &claimedClient{Client: c, hold: s.hold}
}

// recorder drops the events about deployments this replica does not own:
// a reconcile cut short by a handover says nothing about it.
func (s *sharding) recorder(r recorder.EventRecorder) recorder.EventRecorder {
	if s == nil {
		return r
	}
	return &shardEvents{EventRecorder: r, owns: s.owns}
}

// gate is what the controller calls: the sharding itself, in front of r.
func (s *sharding) gate(r reconcile.Reconciler) reconcile.Reconciler {
	if s == nil {
		return r
	}
	return s
}

// everyReplica makes a runnable run on every replica, not only the
// leader, when sharding is on (the drift watcher: each replica watches
// what its own deployments applied).
func (s *sharding) everyReplica(r manager.Runnable) manager.Runnable {
	if s == nil {
		return r
	}
	return notElected{r}
}

// register puts the sharding in front of r and adds the membership loop
// to the manager; enqueue takes the deployments a replica comes to own.
func (s *sharding) register(mgr manager.Manager, r *Reconciler, enqueue chan<- event.GenericEvent) error {
	if s == nil {
		return nil
	}
	s.next, s.forget, s.enqueue = r, r.forget, enqueue
	if err := mgr.Add(s); err != nil {
		return fmt.Errorf("add sharding membership: %w", err)
	}
	return nil
}

type notElected struct{ manager.Runnable }

func (notElected) NeedLeaderElection() bool { return false }

// owns reports whether this replica owns the deployment now.
func (s *sharding) owns(key types.NamespacedName) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ownsLocked(key)
}

func (s *sharding) ownsLocked(key types.NamespacedName) bool {
	return !s.stopping && ShardOwner(key.Namespace, key.Name, s.members) == s.id
}

// Reconcile lets through the reconciles of the deployments this replica
// owns, holding their claim; any other returns at once, with no API
// request and no requeue: its owner reconciles it. A reconcile in
// progress when ownership moves away is cancelled, and its claim released
// once it has returned.
func (s *sharding) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := req.NamespacedName
	ctx, ok := s.enter(ctx, key)
	if !ok {
		return reconcile.Result{}, nil
	}
	defer s.leave(ctx, key)
	wait, err := s.claimFirst(ctx, key)
	if err != nil {
		return reconcile.Result{}, err
	}
	if wait > 0 {
		s.metrics.ClaimWait(s.id)
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	res, err := s.next.Reconcile(ctx, req)
	if !s.owns(key) {
		// Handed over on the way: the new owner carries on.
		return reconcile.Result{}, nil
	}
	return res, err
}

// enter records a reconcile of key in progress, with a context that is
// cancelled when ownership moves away or the claim is lost; false when
// this replica does not own key.
func (s *sharding) enter(ctx context.Context, key types.NamespacedName) (context.Context, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ownsLocked(key) {
		return ctx, false
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &running{cancel: cancel, done: make(chan struct{})}
	s.inflight[key] = r
	go func() {
		defer close(r.done)
		s.keepalive(ctx, key, cancel)
	}()
	return ctx, true
}

// leave ends the reconcile of key; when the deployment is no longer this
// replica's, its claim goes now, after the last write of the reconcile.
func (s *sharding) leave(ctx context.Context, key types.NamespacedName) {
	s.mu.Lock()
	r := s.inflight[key]
	s.mu.Unlock()
	if r != nil {
		r.cancel()
		<-r.done // no renewal after this point
	}
	s.mu.Lock()
	delete(s.inflight, key)
	owned := s.ownsLocked(key)
	stopping := s.stopping
	s.idle.Broadcast()
	s.mu.Unlock()
	if !owned && !stopping {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.LeaseDuration)
		defer cancel()
		s.release(ctx, key)
		s.forget(key.Namespace, key.Name)
	}
}

// ReconcileRequestedAnnotation on a ClusterDeployment asks its owner to
// reconcile it now: a sharded replica that receives a push for a
// deployment another replica owns sets it (to the time), and the owner's
// informer sees the change.
const ReconcileRequestedAnnotation = "capstan.dev/reconcile-requested-at"

// forward passes a push for cd on to its owner when that is another
// replica, and reports whether it did; false without sharding or when
// this replica owns cd (it reconciles it itself).
func (s *sharding) forward(ctx context.Context, c client.Client, cd *capstanv1.ClusterDeployment) bool {
	if s == nil || s.owns(client.ObjectKeyFromObject(cd)) {
		return false
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, ReconcileRequestedAnnotation, s.now().UTC().Format(time.RFC3339Nano))
	if err := c.Patch(ctx, cd.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		log.FromContext(ctx).Info("sharding: could not pass a push on to the deployment's owner; its poll picks the change up",
			"clusterDeployment", cd.Namespace+"/"+cd.Name, "error", err.Error())
	}
	return true
}

// Members returns the live replicas as this replica sees them.
func (s *sharding) Members() []string {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.members)
}

// ShardIdentity is this daemon's name among the sharded replicas; "" with
// sharding off.
func (d *Daemon) ShardIdentity() string {
	if d.shard == nil {
		return ""
	}
	return d.shard.id
}

// ShardMembers returns the live replicas of the daemon's sharding group
// as it sees them, sorted; nil with sharding off.
func (d *Daemon) ShardMembers() []string { return d.shard.Members() }

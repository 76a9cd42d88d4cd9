package reconciler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
)

func keys(n int) []types.NamespacedName {
	out := make([]types.NamespacedName, n)
	for i := range out {
		out[i] = types.NamespacedName{Namespace: fmt.Sprintf("ns-%d", i%7), Name: fmt.Sprintf("cluster-%04d", i)}
	}
	return out
}

func spread(ks []types.NamespacedName, replicas []string) map[string][]types.NamespacedName {
	out := map[string][]types.NamespacedName{}
	for _, k := range ks {
		o := ShardOwner(k.Namespace, k.Name, replicas)
		out[o] = append(out[o], k)
	}
	return out
}

// Rendezvous hashing spreads deployments about evenly, and a replica
// leaving moves only its own share, each to one of the others; coming
// back, it takes exactly that share back.
func TestShardOwnerSpreadsEvenlyAndMovesOnlyTheShareOfWhoLeaves(t *testing.T) {
	ks := keys(3000)
	all := []string{"capstan-0", "capstan-1", "capstan-2"}
	before := spread(ks, all)
	for _, r := range all {
		if n := len(before[r]); n < 800 || n > 1200 {
			t.Errorf("replica %s owns %d of 3000 deployments; want about 1000", r, n)
		}
	}
	if ShardOwner("ns", "x", nil) != "" {
		t.Error("an owner without replicas")
	}
	after := spread(ks, []string{"capstan-0", "capstan-2"})
	for _, k := range ks {
		was, now := ShardOwner(k.Namespace, k.Name, all), ShardOwner(k.Namespace, k.Name, []string{"capstan-0", "capstan-2"})
		if was != "capstan-1" && was != now {
			t.Fatalf("%s moved from %s to %s though its replica stayed", k, was, now)
		}
	}
	if n := len(after["capstan-0"]) + len(after["capstan-2"]); n != 3000 {
		t.Errorf("%d of 3000 deployments owned after a replica left", n)
	}
	for _, k := range before["capstan-1"] {
		if ShardOwner(k.Namespace, k.Name, all) != "capstan-1" {
			t.Fatalf("%s not back with capstan-1", k)
		}
	}
}

func TestLeaseNamesAreValidAndKeepIdentitiesApart(t *testing.T) {
	long := strings.Repeat("x", 300)
	for _, tc := range []struct{ in, want string }{
		{"capstan-7d9f-abcde", "capstan-replica-capstan-7d9f-abcde"},
		{"host_3f0c1a2b", ""},
		{"Host_3f0c1a2b", ""},
		{long, ""},
	} {
		got := ReplicaLeaseName(tc.in)
		if tc.want != "" && got != tc.want {
			t.Errorf("ReplicaLeaseName(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("ReplicaLeaseName(%q) = %q: %v", tc.in, got, errs)
		}
	}
	if ReplicaLeaseName("host_3f0c1a2b") == ReplicaLeaseName("host-3f0c1a2b") {
		t.Error("two identities share a Lease name")
	}
	if ReplicaLeaseName("host_3f0c1a2b") == ReplicaLeaseName("Host_3f0c1a2b") {
		t.Error("two identities that differ in case share a Lease name")
	}
	if got := ClaimLeaseName("mgmt-east"); got != "capstan-claim.mgmt-east" {
		t.Errorf("ClaimLeaseName = %q", got)
	}
}

func lease(holder string, renewed time.Time, seconds int32) coordinationv1.Lease {
	return coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{
		HolderIdentity: ptr.To(holder), RenewTime: &metav1.MicroTime{Time: renewed}, LeaseDurationSeconds: ptr.To(seconds),
	}}
}

func TestLiveReplicas(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		leases   []coordinationv1.Lease
		selfLive bool
		want     []string
	}{
		{"renewed within its duration", []coordinationv1.Lease{lease("b", now.Add(-14*time.Second), 15)}, true, []string{"a", "b"}},
		{"expired", []coordinationv1.Lease{lease("b", now.Add(-15*time.Second), 15)}, true, []string{"a"}},
		{"own Lease judged by its own renewals", []coordinationv1.Lease{lease("a", now, 15), lease("b", now, 15)}, false, []string{"b"}},
		{"released (no holder)", []coordinationv1.Lease{lease("", now, 15)}, true, []string{"a"}},
		{"sorted", []coordinationv1.Lease{lease("c", now, 15), lease("b", now, 15)}, true, []string{"a", "b", "c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := liveReplicas(tc.leases, "a", tc.selfLive, now)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("live = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestShardingOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    ShardingOptions
		ok   bool
	}{
		{"defaults", DefaultShardingOptions(), true},
		{"test timings", ShardingOptions{LeaseDuration: 3 * time.Second, RenewPeriod: 500 * time.Millisecond}, true},
		{"renewing less often than a third", ShardingOptions{LeaseDuration: 3 * time.Second, RenewPeriod: 2 * time.Second}, false},
		{"sub-second lease", ShardingOptions{LeaseDuration: 1500 * time.Millisecond, RenewPeriod: 100 * time.Millisecond}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Namespace = "capstan-system"
			err := tc.o.withDefaults().validate()
			if (err == nil) != tc.ok {
				t.Errorf("validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// clock is a settable clock shared by the replicas of a test.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// testReplica is a sharding replica on a fake API server, with members
// set by hand.
func testReplica(t *testing.T, id string, c client.Client, clk *clock, members ...string) *sharding {
	t.Helper()
	m, err := metrics.ShardFor(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	o := ShardingOptions{Enabled: true, Namespace: "capstan-system", LeaseDuration: 15 * time.Second, RenewPeriod: 5 * time.Second}.withDefaults()
	s := &sharding{
		opts: o, id: id, leases: c, cache: c, metrics: m, now: clk.Now,
		members:  members,
		inflight: map[types.NamespacedName]*running{},
		claims:   map[types.NamespacedName]*heldClaim{},
		forget:   func(string, string) {},
	}
	s.idle = sync.NewCond(&s.mu)
	return s
}

func claimHolder(t *testing.T, c client.Client, key types.NamespacedName) string {
	t.Helper()
	l := &coordinationv1.Lease{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: key.Namespace, Name: ClaimLeaseName(key.Name)}, l); err != nil {
		return ""
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

// Two replicas that disagree about who owns a deployment (each sees a
// membership change at its own look) never both hold its claim: the new
// owner waits until the old one releases it or lets it expire, and the
// old one, once it lost the claim, writes no more.
func TestClaimPassesOnlyByReleaseOrExpiry(t *testing.T) {
	ctx := context.Background()
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "east", UID: "uid-east"}}
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(cd).Build()
	key := client.ObjectKeyFromObject(cd)
	clk := &clock{now: time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)}
	// Each replica believes it alone is live: both own the deployment.
	a := testReplica(t, "a", c, clk, "a")
	b := testReplica(t, "b", c, clk, "b")

	if err := a.hold(ctx, key); err != nil {
		t.Fatalf("a takes a free claim: %v", err)
	}
	l := &coordinationv1.Lease{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "capstan-claim.east"}, l); err != nil {
		t.Fatal(err)
	}
	if len(l.OwnerReferences) != 1 || l.OwnerReferences[0].UID != "uid-east" {
		t.Errorf("claim owner references = %v; want the deployment, so that it goes with it", l.OwnerReferences)
	}
	var held *ClaimHeldError
	if err := b.hold(ctx, key); !errors.As(err, &held) || held.Holder != "a" {
		t.Fatalf("b while a's claim is fresh: %v; want ClaimHeldError naming a", err)
	}
	if wait, err := b.claimFirst(ctx, key); err != nil || wait <= 0 || wait > b.opts.RenewPeriod+b.opts.RenewPeriod/10+1 {
		t.Errorf("b's first reconcile is put off by %s (%v); want at most a renew period", wait, err)
	}

	// a renews within half a duration without a request; past it, with one
	// update, no read.
	clk.add(5 * time.Second)
	if err := a.hold(ctx, key); err != nil {
		t.Fatal(err)
	}
	clk.add(5 * time.Second)
	if err := a.hold(ctx, key); err != nil {
		t.Fatalf("a renews: %v", err)
	}

	// a lets it expire: b takes it over, and a, renewing, finds it lost.
	clk.add(15 * time.Second)
	if err := b.hold(ctx, key); err != nil {
		t.Fatalf("b takes an expired claim: %v", err)
	}
	if h := claimHolder(t, c, key); h != "b" {
		t.Fatalf("holder %q after the takeover, want b", h)
	}
	if err := a.hold(ctx, key); !errors.As(err, &held) || held.Holder != "b" {
		t.Fatalf("a after b took the claim over: %v; want ClaimHeldError naming b", err)
	}

	// b releases it (ownership moved away): a takes it at once.
	b.release(ctx, key)
	if h := claimHolder(t, c, key); h != "" {
		t.Fatalf("holder %q after the release, want none", h)
	}
	if wait, err := a.claimFirst(ctx, key); err != nil || wait != 0 {
		t.Fatalf("a after the release: wait %s, %v", wait, err)
	}
	if h := claimHolder(t, c, key); h != "a" {
		t.Fatalf("holder %q, want a", h)
	}

	// A replica that sees another owner refuses to write whatever the claim.
	b.members = []string{"a", "b"}
	a.members = []string{"a", "b"}
	owner := ShardOwner("ns", "east", []string{"a", "b"})
	other := map[string]*sharding{"a": b, "b": a}[owner]
	var notOwner *NotOwnerError
	if err := other.hold(ctx, key); !errors.As(err, &notOwner) || notOwner.Owner != owner {
		t.Errorf("non-owner writes: %v", err)
	}
	if !IsClaimRefused(fmt.Errorf("stage Apply: %w", &NotOwnerError{})) {
		t.Error("IsClaimRefused misses a wrapped refusal")
	}
}

// A release carries the version the replica wrote last: a claim another
// replica took over since is not deleted.
func TestReleaseLeavesAClaimTakenOver(t *testing.T) {
	ctx := context.Background()
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "east"}}
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(cd).Build()
	key := client.ObjectKeyFromObject(cd)
	clk := &clock{now: time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)}
	a := testReplica(t, "a", c, clk, "a")
	b := testReplica(t, "b", c, clk, "b")
	if err := a.hold(ctx, key); err != nil {
		t.Fatal(err)
	}
	clk.add(16 * time.Second)
	if err := b.hold(ctx, key); err != nil {
		t.Fatal(err)
	}
	a.release(ctx, key)
	if h := claimHolder(t, c, key); h != "b" {
		t.Errorf("holder %q after the old holder's late release, want b", h)
	}
}

// reconcileFunc is a reconcile.Reconciler from a function.
type reconcileFunc func(context.Context, reconcile.Request) (reconcile.Result, error)

func (f reconcileFunc) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	return f(ctx, req)
}

// The gate in front of the reconciler: a deployment another replica owns
// returns at once, with no request to anyone (this replica has no client
// at all here) and no requeue; an owned one whose claim another replica
// still holds is put off; an owned, free one is reconciled under its claim.
func TestGateLetsThroughOnlyOwnedDeploymentsUnderTheirClaim(t *testing.T) {
	ctx := context.Background()
	clk := &clock{now: time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)}
	members := []string{"a", "b"}
	var mine, theirs string
	for i := 0; mine == "" || theirs == ""; i++ {
		name := fmt.Sprintf("cluster-%d", i)
		if ShardOwner("ns", name, members) == "a" {
			mine = name
		} else {
			theirs = name
		}
	}
	calls := 0
	next := reconcileFunc(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		calls++
		return reconcile.Result{RequeueAfter: time.Minute}, nil
	})

	offline := testReplica(t, "a", nil, clk, members...)
	offline.next = next
	res, err := offline.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: theirs}})
	if err != nil || res != (reconcile.Result{}) || calls != 0 {
		t.Fatalf("another replica's deployment: %+v, %v, reconciled %d times; want nothing at all", res, err, calls)
	}

	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: mine}}
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(cd).Build()
	b := testReplica(t, "b", c, clk, "b") // b still believes it owns everything
	if err := b.hold(ctx, client.ObjectKeyFromObject(cd)); err != nil {
		t.Fatal(err)
	}
	a := testReplica(t, "a", c, clk, members...)
	a.next = next
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(cd)}
	res, err = a.Reconcile(ctx, req)
	if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > a.opts.RenewPeriod+a.opts.RenewPeriod/10+1 || calls != 0 {
		t.Fatalf("owned but claimed by b: %+v, %v, reconciled %d times; want put off by at most a renew period", res, err, calls)
	}
	b.release(ctx, req.NamespacedName)
	res, err = a.Reconcile(ctx, req)
	if err != nil || res.RequeueAfter != time.Minute || calls != 1 {
		t.Fatalf("owned and free: %+v, %v, reconciled %d times", res, err, calls)
	}
	if h := claimHolder(t, c, req.NamespacedName); h != "a" {
		t.Errorf("claim held by %q after the reconcile, want a", h)
	}
	if len(a.inflight) != 0 {
		t.Errorf("%d reconciles still recorded in progress", len(a.inflight))
	}
}

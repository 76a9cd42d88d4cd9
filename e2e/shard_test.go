package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/fstest"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/sources/oci"
)

// The sharding test: three replicas share 300 deployments, each
// reconciled by exactly the replica rendezvous hashing names; one replica
// is killed (cut off the API server, so it neither renews nor releases)
// and the other two take its share over once its Lease expires; it comes
// back with the same identity and takes its share back. Through all of
// it, no deployment is written for by two replicas at once: the writes of
// every deployment form runs of one replica each, each run answered
// before the next began.
//
// Who owns what follows the live replicas each replica sees. Should one
// of them see membership change where the test did not change it (a
// replica starved of CPU for a lease duration is rightly taken for dead),
// the test says so, and for that phase checks only that no two replicas
// wrote at once and that each deployment ended written by its owner.
func TestShardingSpreadsTakesOverAndRebalances(t *testing.T) {
	const (
		n             = 300
		leaseDuration = 3 * time.Second
		renewPeriod   = 500 * time.Millisecond
		bulkTimeout   = 5 * time.Minute
	)
	ctx := context.Background()
	c := newClient(t)
	ns := newNamespace(t)
	url := "oci://" + startOCIRegistry(t) + "/shard/cm"
	overlay := fstest.MapFS{
		"cm/kustomization.yaml": {Data: []byte("resources: [cm.yaml]\n")},
		"cm/cm.yaml": {Data: []byte(`apiVersion: v1
kind: ConfigMap
metadata: {name: "cm-${NAME}", namespace: "${NS}"}
data: {rev: "r${REV}"}
`)},
	}
	pushCtx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	if _, err := oci.Push(pushCtx, url, overlay, oci.PushOptions{}); err != nil {
		t.Fatal(err)
	}

	audit := &shardAudit{ns: ns}
	views := newViewMonitor(t)
	daemons := map[string]*reconciler.Daemon{}
	start := func(id string) {
		d, _ := startDaemonWith(t, nil, func(o *reconciler.Options) {
			o.Config = audit.wrap(id, o.Config)
			o.Sharding = reconciler.ShardingOptions{
				Enabled: true, Namespace: ns, Group: "e2e", Identity: id,
				LeaseDuration: leaseDuration, RenewPeriod: renewPeriod,
			}
		})
		daemons[id] = d
		views.set(id, d)
	}
	all := []string{"replica-a", "replica-b", "replica-c"}
	ab := []string{"replica-a", "replica-b"}
	for _, id := range all {
		start(id)
	}
	see := func(ids, want []string) func() (bool, error) { return membersSeen(daemons, ids, want) }
	waitFor(t, "every replica to see the three", see(all, all))
	began := time.Now()

	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("d-%03d", i)
	}
	ownerIn := func(replicas []string) map[string]string {
		out := map[string]string{}
		for _, name := range names {
			out[name] = reconciler.ShardOwner(ns, name, replicas)
		}
		return out
	}
	allReadyAt := func(subset []string, rev string) func() (bool, error) {
		want := map[string]bool{}
		for _, name := range subset {
			want[name] = true
		}
		return func() (bool, error) {
			list := &capstanv1.ClusterDeploymentList{}
			if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
				return false, err
			}
			notReady := 0
			var example string
			for i := range list.Items {
				cd := &list.Items[i]
				if !want[cd.Name] {
					continue
				}
				if s := condition(cd, capstanv1.ConditionStalled); s != nil && s.Status == metav1.ConditionTrue {
					t.Fatalf("%s stalled: %s", cd.Name, describe(cd))
				}
				if !isReady(cd) || cd.Spec.Substitute["REV"] != rev {
					notReady++
					example = cd.Name + ": " + describe(cd)
				}
			}
			if notReady > 0 {
				return false, fmt.Errorf("%d not Ready at REV %s, e.g. %s", notReady, rev, example)
			}
			return true, nil
		}
	}
	checkConfigMaps := func(subset []string, rev string) {
		t.Helper()
		list := &corev1.ConfigMapList{}
		if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, cm := range list.Items {
			got[cm.Name] = cm.Data["rev"]
		}
		for _, name := range subset {
			if got["cm-"+name] != "r"+rev {
				t.Errorf("ConfigMap cm-%s has rev %q, want %q", name, got["cm-"+name], "r"+rev)
			}
		}
	}
	bump := func(subset []string, rev string) {
		t.Helper()
		patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"substitute":{"REV":"`+rev+`"}}}`))
		inParallel(t, subset, func(name string) error {
			return c.Patch(ctx, &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, patch)
		})
	}
	claimedBy := func(subset []string, owners map[string]string) func() (bool, error) {
		return func() (bool, error) {
			list := &coordinationv1.LeaseList{}
			if err := c.List(ctx, list, client.InNamespace(ns), client.HasLabels{reconciler.ClaimLabel}); err != nil {
				return false, err
			}
			holders := map[string]string{}
			for _, l := range list.Items {
				holders[l.Labels[reconciler.ClaimLabel]] = ptr.Deref(l.Spec.HolderIdentity, "")
			}
			left := 0
			for _, name := range subset {
				if holders[name] != owners[name] {
					left++
				}
			}
			return left == 0, fmt.Errorf("%d of %d deployments not claimed by their owner", left, len(subset))
		}
	}
	// checkWriters asserts that between from and to, each deployment of
	// subset was written for by its owner alone, and the others by nobody
	// but theirs (they did not move); with membership unstable, only that
	// the last writer of each was its owner.
	checkWriters := func(phase string, from, to time.Time, subset []string, owners map[string]string, stable bool) {
		t.Helper()
		in := map[string]bool{}
		for _, name := range subset {
			in[name] = true
		}
		last := map[string]string{}
		for d, ws := range audit.byDeployment() {
			for _, w := range ws {
				if !w.start.Before(from) && !w.start.After(to) {
					last[d] = w.replica
				}
			}
		}
		writers := audit.writers(from, to)
		bad := 0
		for _, name := range names {
			w := writers[name]
			var problem string
			switch {
			case !stable:
				if in[name] && last[name] != owners[name] {
					problem = fmt.Sprintf("last written for by %s, want %s", last[name], owners[name])
				}
			case in[name] && (len(w) != 1 || w[owners[name]] == 0):
				problem = fmt.Sprintf("written for by %v, want only %s", w, owners[name])
			case !in[name] && len(w) > 0 && (len(w) != 1 || w[owners[name]] == 0):
				problem = fmt.Sprintf("(not due to change) written for by %v; only %s may", w, owners[name])
			}
			if problem != "" {
				bad++
				if bad <= 5 {
					t.Errorf("%s: %s %s", phase, name, problem)
				}
			}
		}
		if bad > 5 {
			t.Errorf("%s: %d deployments in all with other writers", phase, bad)
		}
	}
	// stableSince says whether membership stayed as the test set it, and
	// logs what changed when not.
	stableSince := func(phase string, from time.Time, want []string, ids ...string) bool {
		if flaps := views.changed(from, time.Now(), want, ids...); flaps != "" {
			t.Logf("%s: membership changed without the test changing it:%s checking only that no two replicas wrote at once", phase, flaps)
			return false
		}
		return true
	}
	spread := func(owners map[string]string) string {
		count := map[string]int{}
		for _, o := range owners {
			count[o]++
		}
		return fmt.Sprint(count)
	}

	// 1. Three replicas, 300 deployments: each reconciled by its owner only.
	owners3 := ownerIn(all)
	created := time.Now()
	inParallel(t, names, func(name string) error {
		return c.Create(ctx, &capstanv1.ClusterDeployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: capstanv1.ClusterDeploymentSpec{
				Source:     &capstanv1.SourceSpec{OCI: &capstanv1.OCISource{URL: url}},
				Path:       "cm",
				Substitute: map[string]string{"NS": ns, "NAME": name, "REV": "1"},
				Interval:   &metav1.Duration{Duration: time.Hour},
			},
		})
	})
	took := waitWithin(t, bulkTimeout, "300 deployments Ready", allReadyAt(names, "1"))
	t.Logf("300 deployments created and Ready in %s; spread %s", took.Round(time.Millisecond), spread(owners3))
	checkConfigMaps(names, "1")
	stable := stableSince("three replicas", began, all, all...)
	checkWriters("three replicas", created, time.Now(), names, owners3, stable)

	// 2. Kill replica-c: a and b take its share over once its Lease expires.
	owners2 := ownerIn(ab)
	var shareC []string
	for _, name := range names {
		if owners3[name] == "replica-c" {
			shareC = append(shareC, name)
		}
	}
	killed := time.Now()
	audit.kill("replica-c")
	seen := waitWithin(t, bulkTimeout, "a and b to see c gone", see(ab, ab))
	taken := waitWithin(t, bulkTimeout, "c's share claimed by a and b", claimedBy(shareC, owners2))
	t.Logf("replica-c killed: a and b saw it gone after %s and claimed its %d deployments %s later (lease duration %s, renew period %s)",
		seen.Round(time.Millisecond), len(shareC), taken.Round(time.Millisecond), leaseDuration, renewPeriod)
	bump(shareC, "2")
	took = waitWithin(t, bulkTimeout, "c's share Ready at REV 2", allReadyAt(shareC, "2"))
	t.Logf("c's share changed and Ready in %s, reconciled by a and b", took.Round(time.Millisecond))
	checkConfigMaps(shareC, "2")
	stable2 := stableSince("after the kill", killed, ab, ab...)
	checkWriters("after the kill", killed, time.Now(), shareC, owners2, stable2)

	// 3. Restart replica-c with the same identity: the spread rebalances.
	stopDaemon(daemons["replica-c"])
	audit.revive("replica-c")
	restarted := time.Now()
	start("replica-c")
	waitFor(t, "every replica to see the three again", see(all, all))
	back := waitWithin(t, bulkTimeout, "c's share claimed by c again", claimedBy(shareC, owners3))
	t.Logf("replica-c restarted: its %d deployments claimed back %s after all saw it", len(shareC), back.Round(time.Millisecond))
	rebalanced := time.Now()
	bump(names, "3")
	took = waitWithin(t, bulkTimeout, "300 deployments Ready at REV 3", allReadyAt(names, "3"))
	t.Logf("all 300 changed and Ready in %s after the rebalance", took.Round(time.Millisecond))
	checkConfigMaps(names, "3")
	stable3 := stableSince("after the restart", restarted, all, ab...) && stableSince("after the rebalance", rebalanced, all, all...)
	checkWriters("after the rebalance", rebalanced, time.Now(), names, owners3, stable3)

	// Never two writers at once, over the whole test: per deployment, runs
	// of one replica that do not overlap; c's share went c, then a or b,
	// then c; the others never moved.
	inShareC := map[string]bool{}
	for _, name := range shareC {
		inShareC[name] = true
	}
	moves, bad := 0, 0
	history := audit.byDeployment()
	for _, name := range names {
		seq, overlap := runs(history[name])
		want := []string{owners3[name]}
		if inShareC[name] {
			want = []string{"replica-c", owners2[name], "replica-c"}
		}
		if overlap != nil || (stable && stable2 && stable3 && !slices.Equal(seq, want)) {
			bad++
			if bad <= 5 {
				t.Errorf("%s: writers in turn %v (want %v); %v\n%s", name, seq, want, overlap, listWrites(history[name]))
			}
		}
		moves += len(seq) - 1
	}
	if bad > 5 {
		t.Errorf("%d deployments in all with an unexpected succession of writers", bad)
	}
	if bad == 0 {
		t.Logf("%d handovers in all, none with two writers at once", moves)
	}
}

// Sharding works with leader election: the leader alone runs the root
// source, but every replica reconciles its own share, the standby
// included; and a push the standby receives for a deployment the leader
// owns is passed on to the leader (an annotation its informer sees), which
// reconciles it at once although its poll is an hour away.
func TestShardingWithLeaderElectionForwardsPushes(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	files := func(version string) map[string]string {
		return map[string]string{
			"app/kustomization.yaml": "resources: [cm.yaml]\n",
			"app/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: \"cm-${NAME}\", namespace: \"${NS}\"}\n" +
				"data: {version: \"v" + version + "\"}\n",
		}
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files("1"), "v1"); err != nil {
		t.Fatal(err)
	}
	tune := func(id string, hook bool) func(*reconciler.Options) {
		return func(o *reconciler.Options) {
			o.Sharding = reconciler.ShardingOptions{Enabled: true, Namespace: ns, Group: "e2e", Identity: id,
				LeaseDuration: 3 * time.Second, RenewPeriod: 500 * time.Millisecond}
			o.LeaderElection = reconciler.LeaderElectionOptions{Enabled: true, Namespace: ns, ID: "capstan-leader",
				LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 200 * time.Millisecond}
			if hook {
				o.Webhook = &reconciler.WebhookOptions{Addr: "127.0.0.1:0", GitHubSecret: []byte(hookSecret)}
			}
		}
	}
	leader, leaderCalls := startDaemonWith(t, nil, tune("replica-a", false))
	waitFor(t, "replica-a to lead", func() (bool, error) { return closed(leader.Elected()), nil })
	standby, standbyCalls := startDaemonWith(t, nil, tune("replica-b", true))
	both := []string{"replica-a", "replica-b"}
	waitFor(t, "both replicas to see each other", func() (bool, error) {
		return slices.Equal(leader.ShardMembers(), both) && slices.Equal(standby.ShardMembers(), both), nil
	})

	// One deployment each replica owns.
	name := map[string]string{}
	for _, candidate := range []string{"one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"} {
		if owner := reconciler.ShardOwner(ns, candidate, both); name[owner] == "" {
			name[owner] = candidate
		}
	}
	if len(name) != 2 {
		t.Fatalf("no deployment name for each replica among ten: %v", name)
	}
	secret := gitSecret(t, c, ns)
	for _, n := range name {
		createDeployment(t, c, ns, n, capstanv1.ClusterDeploymentSpec{
			Source:     &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: secret}}},
			Path:       "app",
			Substitute: map[string]string{"NS": ns, "NAME": n},
			Interval:   &metav1.Duration{Duration: time.Hour},
		})
	}
	for _, n := range name {
		waitDeployment(t, c, ns, n, "Ready", isReady)
	}
	applied := func(calls *requestCounter, owner string) int {
		// "PATCH /api..." leaves the dry-runs out: they count as "PATCH(dry-run) /api...".
		return calls.total("PATCH /api/v1/namespaces/" + ns + "/configmaps/cm-" + name[owner])
	}
	if closed(standby.Elected()) {
		t.Fatal("both replicas lead")
	}
	if applied(standbyCalls, "replica-b") == 0 || applied(leaderCalls, "replica-b") != 0 {
		t.Errorf("the standby's deployment applied by the standby %d times, by the leader %d times; want the standby only",
			applied(standbyCalls, "replica-b"), applied(leaderCalls, "replica-b"))
	}
	if applied(leaderCalls, "replica-a") == 0 || applied(standbyCalls, "replica-a") != 0 {
		t.Errorf("the leader's deployment applied by the leader %d times, by the standby %d times; want the leader only",
			applied(leaderCalls, "replica-a"), applied(standbyCalls, "replica-a"))
	}

	second, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files("2"), "v2")
	if err != nil {
		t.Fatal(err)
	}
	before := applied(leaderCalls, "replica-a")
	push := []byte(`{"ref": "refs/heads/main", "after": "` + second + `", "repository": {"clone_url": "` + url + `"}}`)
	posted := time.Now()
	if code := githubPush(t, standby.WebhookURL()+"github", hookSecret, push); code/100 != 2 {
		t.Fatalf("signed push to the standby: HTTP %d, want 2xx", code)
	}
	for _, n := range name {
		waitDeployment(t, c, ns, n, "Ready at the pushed revision", func(cd *capstanv1.ClusterDeployment) bool {
			return cd.Status.Revision == "main@sha1:"+second && isReady(cd)
		})
	}
	t.Logf("push to the standby -> both deployments Ready at the new revision in %s", time.Since(posted).Round(time.Millisecond))
	if cd := getDeployment(t, c, ns, name["replica-a"]); cd.Annotations[reconciler.ReconcileRequestedAnnotation] == "" {
		t.Errorf("the leader's deployment does not carry %s: the push did not go through the standby", reconciler.ReconcileRequestedAnnotation)
	}
	if applied(leaderCalls, "replica-a") == before || applied(standbyCalls, "replica-a") != 0 {
		t.Errorf("after the push the leader applied its deployment %d more times, the standby %d times; want the leader only",
			applied(leaderCalls, "replica-a")-before, applied(standbyCalls, "replica-a"))
	}
	if v := object(t, c, configMapGVK, ns, "cm-"+name["replica-a"]).Object["data"].(map[string]any)["version"]; v != "v2" {
		t.Errorf("cm-%s version = %v after the push, want v2", name["replica-a"], v)
	}
}

// membersSeen is a condition for waitFor: each of the replicas ids sees
// exactly the members want.
func membersSeen(daemons map[string]*reconciler.Daemon, ids, want []string) func() (bool, error) {
	return func() (bool, error) {
		for _, id := range ids {
			if got := daemons[id].ShardMembers(); !slices.Equal(got, want) {
				return false, fmt.Errorf("%s sees %v", id, got)
			}
		}
		return true, nil
	}
}

package e2e

import (
	"strings"
	"testing"
	"time"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
)

// writesBesidesLease counts a daemon's API writes other than its attempts
// at the leader Lease.
func writesBesidesLease(c *requestCounter) map[string]int {
	out := map[string]int{}
	for k, v := range c.snapshot() {
		if !strings.Contains(k, "/leases/") && !strings.Contains(k, "/leases") {
			out[k] = v
		}
	}
	return out
}

// TestOnlyTheLeaderActsAndAStandbyFinishesItsStage runs two daemons with
// leader election against one cluster: the standby writes nothing while the
// leader applies and waits; when the leader stops, the standby takes the
// Lease, and finishes the stage in progress without applying it again.
func TestOnlyTheLeaderActsAndAStandbyFinishesItsStage(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("1"), "two-stage overlay"); err != nil {
		t.Fatal(err)
	}
	elect := func(o *reconciler.Options) {
		o.LeaderElection = reconciler.LeaderElectionOptions{
			Enabled: true, Namespace: ns, ID: "capstan-leader",
			LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 200 * time.Millisecond,
		}
	}
	leader, leaderCalls := startDaemonWith(t, nil, elect)
	waitFor(t, "the first daemon to lead", func() (bool, error) { return closed(leader.Elected()), nil })
	standby, standbyCalls := startDaemonWith(t, nil, elect)

	createDeployment(t, c, ns, "two", twoStageSpec(url, ns, gitSecret(t, c, ns)))
	cd := waitDeployment(t, c, ns, "two", "stage Infra applied and waiting", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "Infra").State == capstanv1.StageInProgress && stage(cd, "Infra").AppliedAt != nil
	})
	applied := stage(cd, "Infra").AppliedAt
	if closed(standby.Elected()) {
		t.Fatal("both daemons lead")
	}
	if w := writesBesidesLease(standbyCalls); len(w) > 0 {
		t.Errorf("the standby wrote while the other daemon led: %v", w)
	}

	// A graceful stop releases the Lease: the standby takes over at once.
	stopped := time.Now()
	stopDaemon(leader)
	waitFor(t, "the standby to lead", func() (bool, error) { return closed(standby.Elected()), nil })
	t.Logf("the standby leads %s after the leader stopped", time.Since(stopped).Round(time.Millisecond))

	setWidgetReady(t, c, ns, "infra")
	cd = waitDeployment(t, c, ns, "two", "Ready", isReady)
	if got := stage(cd, "Infra").AppliedAt; !got.Equal(applied) {
		t.Errorf("stage Infra applied again after the failover: appliedAt %s, then %s", applied, got)
	}
	if n := standbyCalls.total("PATCH /", "/widgets/infra"); n != 0 {
		t.Errorf("the new leader patched the Widget of stage Infra %d times; it was applied already", n)
	}
	if n := standbyCalls.total("PATCH /", "/configmaps/app-config"); n == 0 {
		t.Error("the new leader did not apply stage App")
	}
	if n := leaderCalls.total("PATCH /", "/configmaps/app-config"); n != 0 {
		t.Errorf("the stopped leader applied stage App %d times", n)
	}
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

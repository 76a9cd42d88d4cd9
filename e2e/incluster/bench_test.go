package incluster

import (
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// BenchmarkInstallToReady times `capstan install` from nothing to a
// daemon that runs and leads, uninstalling between rounds. Figures go to
// docs/benchmarks.md.
func BenchmarkInstallToReady(b *testing.B) {
	var total time.Duration
	for range b.N {
		begin := time.Now()
		if out, err := capstan(b, baseInstallArgs(b)...); err != nil {
			b.Fatalf("install: %v\n%s", err, out)
		}
		total += time.Since(begin)
		if out, err := capstan(b, "uninstall", "--force"); err != nil {
			b.Fatalf("uninstall: %v\n%s", err, out)
		}
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/install")
}

// baseInstallArgs install without a root source.
func baseInstallArgs(t testing.TB) []string {
	var args []string
	skip := false
	for _, a := range installArgs(t) {
		switch {
		case skip:
			skip = false
		case a == "--source" || a == "--branch" || a == "--path" || a == "--source-username" || a == "--interval":
			skip = true
		default:
			args = append(args, a)
		}
	}
	return args
}

// BenchmarkLeaderFailover times the handover of the Lease: graceful (the
// leader's pod is deleted and releases the Lease on its way out) and hard
// (a leading process is killed with SIGKILL; a new replica waits for the
// Lease to expire).
func BenchmarkLeaderFailover(b *testing.B) {
	ports.metrics, ports.health = freePort(b), freePort(b)
	c := newClient(b)
	if out, err := capstan(b, baseInstallArgs(b)...); err != nil {
		b.Fatalf("install: %v\n%s", err, out)
	}
	defer capstan(b, "uninstall", "--force")
	var graceful, hard time.Duration
	for range b.N {
		// Graceful: delete the leading pod; another replica leads.
		holder := leaseHolder(b, c)
		pod := daemonPod(b, c)
		begin := time.Now()
		if err := c.Delete(b.Context(), pod); err != nil {
			b.Fatal(err)
		}
		waitFor(b, "a new leader", func() (bool, string, error) {
			h := leaseHolder(b, c)
			return h != "" && h != holder, h, nil
		})
		graceful += time.Since(begin)

		// Hard: a standby process takes over once the Deployment is scaled
		// to zero, then dies without releasing the Lease.
		standby := startStandby(b)
		scale(b, c, 0)
		waitFor(b, "the standby to lead", func() (bool, string, error) {
			return strings.Contains(standby.log.String(), "leading: this replica acts now"), tail(standby.log.String(), 2), nil
		})
		holder = leaseHolder(b, c)
		begin = time.Now()
		_ = standby.cmd.Process.Signal(syscall.SIGKILL)
		<-standby.done
		scale(b, c, 1)
		waitFor(b, "the pod to take the Lease over", func() (bool, string, error) {
			h := leaseHolder(b, c)
			return h != "" && h != holder, h, nil
		})
		hard += time.Since(begin)
	}
	b.ReportMetric(graceful.Seconds()/float64(b.N), "s/graceful-failover")
	b.ReportMetric(hard.Seconds()/float64(b.N), "s/hard-failover")
}

func scale(t testing.TB, c client.Client, replicas int32) {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: capstanNS, Name: "capstan"}, d); err != nil {
		t.Fatal(err)
	}
	d.Spec.Replicas = ptr.To(replicas)
	if err := c.Update(t.Context(), d); err != nil {
		t.Fatal(err)
	}
}

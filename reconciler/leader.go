package reconciler

import (
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaderElectionOptions configure the Lease-based leader election that
// makes one of several replicas act: the ClusterDeployment controller, the
// root source, the source watcher. The others keep their caches warm and
// answer /healthz and /readyz, and take over when the leader's Lease is
// released (a graceful stop) or expires.
type LeaderElectionOptions struct {
	// Enabled turns leader election on; `capstan run` has it on, `capstan
	// dev` and in-process tests off.
	Enabled bool
	// Namespace holds the Lease; empty means the pod's namespace, else
	// capstan-system.
	Namespace string
	// ID names the Lease.
	ID string
	// LeaseDuration is how long a standby waits after the last renewal
	// before it takes a Lease over; RenewDeadline is how long the leader
	// keeps trying to renew before it gives up acting; RetryPeriod is how
	// often both try.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// DefaultLeaderElectionOptions are client-go's usual timings, with the
// Lease "capstan-leader".
func DefaultLeaderElectionOptions() LeaderElectionOptions {
	return LeaderElectionOptions{
		Enabled:       true,
		ID:            "capstan-leader",
		LeaseDuration: 15 * time.Second,
		RenewDeadline: 10 * time.Second,
		RetryPeriod:   2 * time.Second,
	}
}

// serviceAccountNamespace is where a pod learns its own namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// namespace returns the namespace of the Lease.
func (o LeaderElectionOptions) namespace() string {
	if o.Namespace != "" {
		return o.Namespace
	}
	if data, err := os.ReadFile(serviceAccountNamespace); err == nil && strings.TrimSpace(string(data)) != "" {
		return strings.TrimSpace(string(data))
	}
	return "capstan-system"
}

// homeNamespace is the namespace Capstan runs in, which no prune or
// deletion removes: the pod's, else the Lease's when set; "" outside a
// pod with no namespace given (capstan dev, the tests' daemons).
func (o LeaderElectionOptions) homeNamespace() string {
	if data, err := os.ReadFile(serviceAccountNamespace); err == nil && strings.TrimSpace(string(data)) != "" {
		return strings.TrimSpace(string(data))
	}
	return o.Namespace
}

// identity names this replica in the Lease: the pod's name ($POD_NAME, set
// by the Deployment through the downward API; a host-network pod's host
// name is the node's) or the host name, and a random suffix so that two
// processes on one host differ.
func identity() string {
	name := os.Getenv("POD_NAME")
	if name == "" {
		name, _ = os.Hostname()
	}
	return name + "_" + string(uuid.NewUUID())[:8]
}

// newLeaseLock returns the Lease lock for cfg's cluster.
func newLeaseLock(cfg *rest.Config, o LeaderElectionOptions, id string) (resourcelock.Interface, error) {
	cs, err := kubernetes.NewForConfig(rest.AddUserAgent(rest.CopyConfig(cfg), "leader-election"))
	if err != nil {
		return nil, fmt.Errorf("leader election client: %w", err)
	}
	return resourcelock.New(resourcelock.LeasesResourceLock, o.namespace(), o.ID,
		cs.CoreV1(), cs.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
}

package metrics

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Names of the sharding families (docs/sharding.md).
const (
	ShardDeployments = Prefix + "shard_deployments"
	ShardReplicas    = Prefix + "shard_replicas"
	ShardClaimWaits  = Prefix + "shard_claim_waits_total"
)

// ShardCollector holds the families of a sharded daemon, one series per
// replica each: a process serves its own, and several daemons in one
// process (tests) keep theirs apart. Its methods are safe for concurrent
// use.
type ShardCollector struct {
	deployments *prometheus.GaugeVec
	replicas    *prometheus.GaugeVec
	claimWaits  *prometheus.CounterVec
}

var (
	shardMu     sync.Mutex
	shardShared = map[prometheus.Registerer]*ShardCollector{}
)

// ShardFor returns the sharding collector registered on reg, registering
// one the first time (like For).
func ShardFor(reg prometheus.Registerer) (*ShardCollector, error) {
	shardMu.Lock()
	defer shardMu.Unlock()
	if c, ok := shardShared[reg]; ok {
		return c, nil
	}
	c := &ShardCollector{
		deployments: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: ShardDeployments,
			Help: "ClusterDeployments this replica owns: rendezvous hashing over the live replicas gives them to it.",
		}, []string{"replica"}),
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: ShardReplicas,
			Help: "Live replicas of the sharding group as this replica sees them (their membership Leases not expired), itself included while its own Lease is renewed.",
		}, []string{"replica"}),
		claimWaits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: ShardClaimWaits,
			Help: "Reconciles this replica put off because another replica still held the deployment's claim (a handover in progress).",
		}, []string{"replica"}),
	}
	for _, col := range []prometheus.Collector{c.deployments, c.replicas, c.claimWaits} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("register Capstan sharding metrics: %w", err)
		}
	}
	shardShared[reg] = c
	return c, nil
}

// Observe records what replica owns and how many replicas it sees live.
func (c *ShardCollector) Observe(replica string, owned, live int) {
	c.deployments.WithLabelValues(replica).Set(float64(owned))
	c.replicas.WithLabelValues(replica).Set(float64(live))
}

// ClaimWait counts one reconcile put off for another replica's claim.
func (c *ShardCollector) ClaimWait(replica string) {
	c.claimWaits.WithLabelValues(replica).Inc()
}

// Forget deletes the series of a replica that stopped.
func (c *ShardCollector) Forget(replica string) {
	c.deployments.DeleteLabelValues(replica)
	c.replicas.DeleteLabelValues(replica)
	c.claimWaits.DeleteLabelValues(replica)
}

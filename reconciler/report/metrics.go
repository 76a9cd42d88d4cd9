package report

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/capstan-dev/capstan/reconciler/metrics"
)

// Names of the report families (docs/metrics.md).
const (
	CommitsTotal     = metrics.Prefix + "report_commits_total"
	PushRacesTotal   = metrics.Prefix + "report_push_races_total"
	PendingStatuses  = metrics.Prefix + "report_pending"
	resultCommitted  = "committed"
	resultUnchanged  = "unchanged"
	resultFailed     = "failed"
	resultRejected   = "rejected"
	labelResult      = "result"
	registerErrorFmt = "register Capstan report metrics: %w"
)

// collector holds the report families. Its methods are safe for
// concurrent use, and on a nil collector do nothing.
type collector struct {
	commits *prometheus.CounterVec
	races   prometheus.Counter
	pending prometheus.Gauge
}

var (
	collectorsMu sync.Mutex
	collectors   = map[prometheus.Registerer]*collector{}
)

// collectorFor returns the collector registered on reg, registering one
// the first time: several daemons in one process (tests) share it.
func collectorFor(reg prometheus.Registerer) (*collector, error) {
	if reg == nil {
		return nil, nil
	}
	collectorsMu.Lock()
	defer collectorsMu.Unlock()
	if c, ok := collectors[reg]; ok {
		return c, nil
	}
	c := &collector{
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: CommitsTotal,
			Help: "Attempts at committing deployments' status files to a status branch, by result: committed, unchanged (the branch held them already), failed (retried with backoff), rejected (the setting cannot work, one per deployment).",
		}, []string{labelResult}),
		races: prometheus.NewCounter(prometheus.CounterOpts{
			Name: PushRacesTotal,
			Help: "Status pushes that lost a race (the branch moved meanwhile) and were written again on top of the new tip.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: PendingStatuses,
			Help: "Deployments whose latest status waits to be committed: in their coalescing window, or retrying a failed push.",
		}),
	}
	for _, col := range []prometheus.Collector{c.commits, c.races, c.pending} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf(registerErrorFmt, err)
		}
	}
	for _, r := range []string{resultCommitted, resultUnchanged, resultFailed, resultRejected} {
		c.commits.WithLabelValues(r)
	}
	collectors[reg] = c
	return c, nil
}

func (c *collector) count(result string, n int) {
	if c != nil && n > 0 {
		c.commits.WithLabelValues(result).Add(float64(n))
	}
}

func (c *collector) raced(n int) {
	if c != nil && n > 0 {
		c.races.Add(float64(n))
	}
}

func (c *collector) setPending(n int) {
	if c != nil {
		c.pending.Set(float64(n))
	}
}

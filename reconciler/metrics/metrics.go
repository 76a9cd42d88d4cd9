package metrics

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// Prefix starts the name of every metric family Capstan exports.
const Prefix = "capstan_"

// Names of the metric families, for docs, dashboards and alert rules.
const (
	StageState                = Prefix + "stage_state"
	StageStartedTimestamp     = Prefix + "stage_started_timestamp_seconds"
	StageDuration             = Prefix + "stage_duration_seconds"
	StageStuck                = Prefix + "stage_stuck"
	ReconcileDuration         = Prefix + "reconcile_duration_seconds"
	ReconcileFailures         = Prefix + "reconcile_consecutive_failures"
	SourceFetchDuration       = Prefix + "source_fetch_duration_seconds"
	SourceLastSuccess         = Prefix + "source_last_success_timestamp_seconds"
	SourceInterval            = Prefix + "source_interval_seconds"
	SourceRevisionInfo        = Prefix + "source_revision_info"
	ApplyObjectsTotal         = Prefix + "apply_objects_total"
	PivotState                = Prefix + "pivot_state"
	DriftCorrectionsTotal     = Prefix + "drift_corrections_total"
	labelNamespace, labelName = "namespace", "cluster"
)

// States are the values of the state label of capstan_stage_state, one
// series each per stage.
var States = []capstanv1.StageState{
	capstanv1.StagePending, capstanv1.StageInProgress, capstanv1.StageReady, capstanv1.StageFailed,
}

// Outcome is how one reconcile ended, the result label of
// capstan_reconcile_duration_seconds.
type Outcome string

const (
	// OutcomeSuccess: the reconcile did what it could; a stage still
	// waiting for readiness is a success.
	OutcomeSuccess Outcome = "success"
	// OutcomeError: the reconcile failed and will be retried with backoff.
	OutcomeError Outcome = "error"
	// OutcomeStalled: the reconcile failed in a way only a new revision or
	// spec can fix, or found the deployment still stalled on its input.
	OutcomeStalled Outcome = "stalled"
)

// StageResult is how a stage's attempt ended, the result label of
// capstan_stage_duration_seconds.
type StageResult string

const (
	// StageResultReady: the stage became Ready.
	StageResultReady StageResult = "ready"
	// StageResultFailed: an attempt at the stage failed; it is retried.
	StageResultFailed StageResult = "failed"
)

// SourceOperation is what was asked of a source, the operation label of
// capstan_source_fetch_duration_seconds.
type SourceOperation string

const (
	// SourceRevision is the cheap check of the remote's revision.
	SourceRevision SourceOperation = "revision"
	// SourceFetch downloads the content at a revision.
	SourceFetch SourceOperation = "fetch"
)

// SourceObservation is one request to a deployment's source.
type SourceObservation struct {
	Operation SourceOperation
	// Duration is how long the request took.
	Duration time.Duration
	// Revision is what the source answered; empty on error.
	Revision string
	// Interval is how often the deployment polls its source.
	Interval time.Duration
	// Err is the request's error, nil when the source answered.
	Err error
}

// Collector holds Capstan's metric families. Its methods are safe for
// concurrent use.
type Collector struct {
	stageState        *prometheus.GaugeVec
	stageStarted      *prometheus.GaugeVec
	stageDuration     *prometheus.HistogramVec
	stageStuck        *prometheus.GaugeVec
	reconcileDuration *prometheus.HistogramVec
	failures          *prometheus.GaugeVec
	sourceDuration    *prometheus.HistogramVec
	sourceSuccess     *prometheus.GaugeVec
	sourceInterval    *prometheus.GaugeVec
	revisionInfo      *prometheus.GaugeVec
	applyObjects      *prometheus.CounterVec
	drift             *prometheus.CounterVec
	pivotState        *prometheus.GaugeVec

	now func() time.Time

	mu          sync.Mutex
	deployments map[key]*deployment
	// stageUsers counts, per stage name, the deployments whose recorded
	// status has a stage of that name; ended holds the names with a
	// stage_duration_seconds series. A name is a committer's string, so a
	// name no deployment uses any more loses its histogram: renaming a
	// stage at every revision must not grow the series without bound.
	stageUsers map[string]int
	ended      map[string]bool
}

type key struct{ namespace, name string }

// deployment is what the collector remembers of one ClusterDeployment to
// delete series that no longer apply.
type deployment struct {
	stages   map[string]bool
	revision string
	failures int
}

// Option configures a Collector.
type Option func(*Collector)

// WithClock sets the clock that stamps source successes (tests).
func WithClock(now func() time.Time) Option {
	return func(c *Collector) { c.now = now }
}

// New returns a collector whose families are registered on reg.
// Registering a second collector on the same registry fails; use For to
// share one per registry.
func New(reg prometheus.Registerer, opts ...Option) (*Collector, error) {
	c := newCollector()
	for _, o := range opts {
		o(c)
	}
	for _, col := range c.collectors() {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("register Capstan metrics: %w", err)
		}
	}
	return c, nil
}

var (
	sharedMu sync.Mutex
	shared   = map[prometheus.Registerer]*Collector{}
)

// For returns the collector registered on reg, registering one the first
// time. Several daemons in one process (tests, pivot) share it, instead of
// failing on a duplicate registration.
func For(reg prometheus.Registerer) (*Collector, error) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if c, ok := shared[reg]; ok {
		return c, nil
	}
	c, err := New(reg)
	if err != nil {
		return nil, err
	}
	shared[reg] = c
	return c, nil
}

func newCollector() *Collector {
	perStage := []string{labelNamespace, labelName, "stage"}
	perDeployment := []string{labelNamespace, labelName}
	c := &Collector{
		stageState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: StageState,
			Help: "1 for the stage's current state, 0 for the other states.",
		}, append(perStage, "state")),
		stageStarted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: StageStartedTimestamp,
			Help: "When the stage first left Pending at the current revision, in seconds since the epoch; absent while Pending.",
		}, perStage),
		stageDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    StageDuration,
			Help:    "Time from a stage's start to its end: Ready (result=ready) or a failed attempt (result=failed).",
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400},
		}, []string{"stage", "result"}),
		stageStuck: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: StageStuck,
			Help: "1 while the stage has been in progress longer than its stuckAfter, else 0.",
		}, perStage),
		reconcileDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    ReconcileDuration,
			Help:    "Duration of one reconcile of a ClusterDeployment, by result (success, error, stalled). Waiting for a stage is a success.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"result"}),
		failures: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: ReconcileFailures,
			Help: "Reconciles of the ClusterDeployment that failed in a row; 0 after one that did not fail.",
		}, perDeployment),
		sourceDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    SourceFetchDuration,
			Help:    "Duration of a request to a source: operation=revision (the remote's revision) or fetch (content).",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"operation", "result"}),
		sourceSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: SourceLastSuccess,
			Help: "When the ClusterDeployment's source last answered, in seconds since the epoch; 0 if it has not since the daemon started.",
		}, perDeployment),
		sourceInterval: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: SourceInterval,
			Help: "How often the ClusterDeployment polls its source, in seconds.",
		}, perDeployment),
		revisionInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: SourceRevisionInfo,
			Help: "1 for the source revision the ClusterDeployment last saw.",
		}, append(perDeployment, "revision")),
		applyObjects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: ApplyObjectsTotal,
			Help: "Objects applied by stages of the ClusterDeployment, by what the apply did (created, configured, unchanged, ...).",
		}, append(perDeployment, "action")),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: DriftCorrectionsTotal,
			Help: "Applied objects found deleted or changed by another field manager, by what Capstan did: corrected (applied again) or reported (spec.drift: report).",
		}, append(perDeployment, "action")),
		pivotState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: PivotState,
			Help: "1 for the last phase a move of the ClusterDeployment into another cluster finished (status.pivot.phase), 0 for the other phases; absent without a move.",
		}, append(perDeployment, "phase")),
		now:         time.Now,
		deployments: map[key]*deployment{},
		stageUsers:  map[string]int{},
		ended:       map[string]bool{},
	}
	// Series that exist before anything happened, so that dashboards and
	// absent() see the daemon as soon as it serves metrics.
	for _, o := range []Outcome{OutcomeSuccess, OutcomeError, OutcomeStalled} {
		c.reconcileDuration.WithLabelValues(string(o))
	}
	for _, op := range []SourceOperation{SourceRevision, SourceFetch} {
		for _, r := range []string{"success", "error"} {
			c.sourceDuration.WithLabelValues(string(op), r)
		}
	}
	return c
}

func (c *Collector) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		c.stageState, c.stageStarted, c.stageDuration, c.stageStuck,
		c.reconcileDuration, c.failures,
		c.sourceDuration, c.sourceSuccess, c.sourceInterval, c.revisionInfo,
		c.applyObjects, c.drift, c.pivotState,
	}
}

// perDeployment lists the families with series per ClusterDeployment,
// which Forget deletes.
func (c *Collector) perDeployment() []interface {
	DeletePartialMatch(prometheus.Labels) int
} {
	return []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{
		c.stageState, c.stageStarted, c.stageStuck, c.failures,
		c.sourceSuccess, c.sourceInterval, c.revisionInfo, c.applyObjects, c.drift, c.pivotState,
	}
}

func (c *Collector) entry(cd *capstanv1.ClusterDeployment) *deployment {
	k := key{cd.Namespace, cd.Name}
	d, ok := c.deployments[k]
	if !ok {
		d = &deployment{stages: map[string]bool{}}
		c.deployments[k] = d
	}
	return d
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

package reconciler

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// Options configure a Daemon.
type Options struct {
	// Config reaches the cluster Capstan manages objects in.
	Config *rest.Config
	// Root, when set, is the root source whose ClusterDeployments the daemon applies.
	Root *RootOptions
	// MetricsAddr serves Prometheus metrics at /metrics; "0" disables it.
	MetricsAddr string
	// MetricsRegistry receives Capstan's metrics. Nil means
	// controller-runtime's registry, the one MetricsAddr serves. Daemons
	// sharing a registry share one collector.
	MetricsRegistry prometheus.Registerer
	// HealthAddr serves /healthz and /readyz; "0" disables it.
	HealthAddr string
	// PprofAddr serves Go's profiles at /debug/pprof/; "" or "0"
	// disables it (the default: profiles show what the process holds).
	PprofAddr string
	// Workers is how many deployments are reconciled at once.
	Workers int
	// ApplyConcurrency is how many objects one stage applies in parallel.
	ApplyConcurrency int
	// Reconciler tunes the loop.
	Reconciler ReconcilerOptions
	// Webhook, when set, serves the push receiver: an authentic push for a
	// followed branch reconciles its deployments at once.
	Webhook *WebhookOptions
	// LeaderElection makes one of several replicas act.
	LeaderElection LeaderElectionOptions
	// Sharding makes every replica act, each on its share of the
	// deployments (shard.go, docs/sharding.md).
	Sharding ShardingOptions
	// ClusterName describes the cluster the daemon runs in, for people:
	// in fencing records and on deployments it moves. Empty means
	// "cluster <first characters of its identity>".
	ClusterName string
	// Installer, when set, lets a pivot stage install Capstan into the
	// cluster it moved a deployment into (`capstan run --image` sets one).
	Installer stages.Installer
	// Kubeconfigs says what a kubeconfig Secret may hold beyond what only
	// connects: exec plugins and auth-providers, insecure TLS (capstan
	// run --insecure-kubeconfig-exec, --insecure-kubeconfig-tls;
	// docs/kubeconfigs.md). The zero value allows neither.
	Kubeconfigs stages.KubeconfigPolicy

	// Report configures status commits to git (docs/report.md).
	Report ReportOptions

	// Logger, when set, receives the daemon's logs instead of
	// controller-runtime's global logger (the e2e tests read them).
	Logger logr.Logger

	// Artifacts bound what artifacts and renders may take: the cache
	// directory and its size, per-file, per-artifact, decompressed, render
	// and object limits, renders at once (docs/limits.md).
	Artifacts ArtifactOptions
}

// DefaultOptions returns the options `capstan run` starts with.
func DefaultOptions() Options {
	return Options{
		MetricsAddr:      ":8080",
		HealthAddr:       ":8081",
		Workers:          4,
		ApplyConcurrency: 16,
		Reconciler:       DefaultReconcilerOptions(),
		LeaderElection:   DefaultLeaderElectionOptions(),

		Artifacts: DefaultArtifactOptions(),
	}
}

// Daemon is the long-running Capstan process: the ClusterDeployment
// controller and, when configured, the root source.
type Daemon struct {
	manager    manager.Manager
	reconciler *Reconciler
	root       *rootSource
	webhook    *webhookServer
	stop       chan struct{}
	stopOnce   sync.Once
	done       chan struct{}
	identity   string
	shard      *sharding
	logger     logr.Logger
}

// Scheme returns a scheme with the built-in kinds and Capstan's API.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = capstanv1.AddToScheme(s)
	return s
}

// New builds a daemon; nothing runs until Run.
func New(opts Options) (*Daemon, error) {
	if opts.Config == nil {
		return nil, errors.New("new daemon: no cluster config")
	}
	if opts.Reconciler.Now == nil {
		opts.Reconciler = DefaultReconcilerOptions()
	}
	scheme := Scheme()
	le := opts.LeaderElection
	id := identity()
	mgrOpts := ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: opts.MetricsAddr},
		HealthProbeBindAddress: opts.HealthAddr,
		PprofBindAddress:       opts.PprofAddr,
		Logger:                 opts.Logger,
		Client: client.Options{Cache: &client.CacheOptions{
			// Secrets are read one by one (source credentials once per
			// source change, a kubeconfig once per attempt at a remote
			// stage); caching every Secret in the cluster would cost
			// memory and RBAC.
			DisableFor: []client.Object{&corev1.Secret{}},
		}},
	}
	if opts.Logger.GetSink() != nil {
		// controller-runtime starts what mgr.Add adds (the root source,
		// the source watcher, sharding, status commits, the webhook
		// receiver) with BaseContext, not with the context Run gives
		// Start: without this, their log.FromContext is the process-wide
		// logger and Logger never sees their lines.
		logger := opts.Logger
		mgrOpts.BaseContext = func() context.Context { return log.IntoContext(context.Background(), logger) }
	}
	if le.Enabled {
		lock, err := newLeaseLock(opts.Config, le, id)
		if err != nil {
			return nil, fmt.Errorf("new daemon: %w", err)
		}
		mgrOpts.LeaderElection = true
		mgrOpts.LeaderElectionResourceLockInterface = lock
		mgrOpts.LeaderElectionReleaseOnCancel = true
		mgrOpts.LeaseDuration, mgrOpts.RenewDeadline, mgrOpts.RetryPeriod = &le.LeaseDuration, &le.RenewDeadline, &le.RetryPeriod
	}
	mgr, err := ctrl.NewManager(opts.Config, mgrOpts)
	if err != nil {
		return nil, fmt.Errorf("new daemon: create manager: %w", err)
	}
	if opts.HealthAddr != "0" {
		if err := addProbes(mgr, opts.Config); err != nil {
			return nil, fmt.Errorf("new daemon: %w", err)
		}
	}
	reg := opts.MetricsRegistry
	if reg == nil {
		reg = ctrlmetrics.Registry
	}
	collector, err := metrics.For(reg)
	if err != nil {
		return nil, fmt.Errorf("new daemon: %w", err)
	}
	direct, err := client.NewWithWatch(opts.Config, client.Options{Scheme: scheme, Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return nil, fmt.Errorf("new daemon: create client: %w", err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("new daemon: create discovery client: %w", err)
	}
	// The daemon writes as the Capstan of its cluster: the fencing
	// records of its deployments name that cluster's identity, learnt at
	// the first write.
	identify := func(ctx context.Context) (string, string, error) {
		id, err := pivot.ClusterID(ctx, direct)
		if err != nil {
			return "", "", err
		}
		name := opts.ClusterName
		if name == "" {
			name = "cluster " + id[:min(8, len(id))]
		}
		return id, name, nil
	}
	execOpts := []stages.ExecutorOption{stages.WithConcurrency(opts.ApplyConcurrency), stages.WithHomeDiscovery(disco),
		stages.WithIdentityFrom(identify)}
	if opts.Installer != nil {
		execOpts = append(execOpts, stages.WithInstaller(opts.Installer))
	}
	shard, err := newSharding(opts.Sharding, id, mgr, reg)
	if err != nil {
		return nil, fmt.Errorf("new daemon: %w", err)
	}
	execOpts = append(execOpts, shard.executorOptions()...)
	home := opts.homeNamespace()
	execOpts = append(execOpts, stages.WithHomeNamespace(home))
	srcs, err := newSourceCache(opts.Artifacts)
	if err != nil {
		return nil, fmt.Errorf("new daemon: %w", err)
	}
	r := &Reconciler{
		client:   shard.client(mgr.GetClient()),
		executor: stages.NewExecutor(direct, execOpts...),
		actors:   newActors(opts.Config, scheme, mgr.GetRESTMapper()),
		sources:  srcs,
		clusters: newClusterCache(mgr.GetAPIReader(), scheme, &kubeconfigRules{home: home, policy: opts.Kubeconfigs, homeID: homeIdentity(mgr.GetAPIReader())}),
		events:   shard.recorder(mgr.GetEventRecorder("capstan")),
		metrics:  collector,
		opts:     opts.Reconciler,
	}
	workers := opts.Workers
	if workers <= 0 {
		workers = 4
	}
	pushes := make(chan event.GenericEvent, 64)
	// A source operation that ends wakes the deployments waiting for it
	// (sourceops.go).
	srcs.wakeInto(pushes)
	drifts := make(chan event.GenericEvent, 1024)
	meta, err := metadata.NewForConfig(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("new daemon: create metadata client: %w", err)
	}
	core, err := corev1client.NewForConfig(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("new daemon: create core client: %w", err)
	}
	r.clusters.rules.actorOf = r.actorOf
	r.drift = newDriftWatcher(mgr.GetLogger().WithName("drift"), watchConn{name: stages.LocalClusterName, meta: meta, mapper: mgr.GetRESTMapper()}, core.RESTClient(), scheme, drifts)
	r.drift.rules = r.clusters.rules
	if err := mgr.Add(shard.everyReplica(r.drift)); err != nil {
		return nil, fmt.Errorf("new daemon: add drift watcher: %w", err)
	}
	err = ctrl.NewControllerManagedBy(mgr).
		WatchesRawSource(source.Channel(pushes, &handler.EnqueueRequestForObject{})).
		// Applied objects that drifted wake their deployment.
		WatchesRawSource(source.Channel(drifts, &handler.EnqueueRequestForObject{})).
		// A deployment that others depend on wakes them when its
		// readiness changes.
		Watches(&capstanv1.ClusterDeployment{}, handler.EnqueueRequestsFromMapFunc((&dependentsIndex{reader: mgr.GetClient(), indexer: mgr.GetFieldIndexer()}).dependents),
			builder.WithPredicates(readinessChanged)).
		For(&capstanv1.ClusterDeployment{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		// Several daemons may run in one process (the e2e suites, pivot).
		// Sharded, every replica reconciles (its own share).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers, SkipNameValidation: ptr.To(true), NeedLeaderElection: ptr.To(shard == nil)}).
		Complete(shard.gate(r))
	if err != nil {
		return nil, fmt.Errorf("new daemon: register controller: %w", err)
	}
	if err := shard.register(mgr, r, pushes); err != nil {
		return nil, fmt.Errorf("new daemon: %w", err)
	}
	if err := addReporter(opts, mgr, reg, r, shard); err != nil {
		return nil, fmt.Errorf("new daemon: %w", err)
	}
	if err := addPullRequests(opts, mgr, reg, r, shard); err != nil {
		return nil, fmt.Errorf("new daemon: %w", err)
	}
	d := &Daemon{manager: mgr, reconciler: r, stop: make(chan struct{}), done: make(chan struct{}), identity: id, shard: shard, logger: opts.Logger}
	if opts.Root != nil {
		root, err := newRootSource(*opts.Root, mgr.GetClient(), r.sources, home)
		if err != nil {
			return nil, fmt.Errorf("new daemon: %w", err)
		}
		if err := mgr.Add(root); err != nil {
			return nil, fmt.Errorf("new daemon: add root source: %w", err)
		}
		d.root = root
		if w, ok := opts.Root.Source.(WatchedSource); ok {
			trigger := &pushTrigger{client: mgr.GetClient(), root: root, enqueue: pushes, elected: mgr.Elected(), shard: shard, sources: r.sources, logger: mgr.GetLogger()}
			if err := mgr.Add(&sourceWatcher{source: w, trigger: trigger, url: root.opts.URL, branch: root.opts.Branch}); err != nil {
				return nil, fmt.Errorf("new daemon: add source watcher: %w", err)
			}
		}
	}
	if opts.Webhook != nil {
		srv, err := newWebhookServer(*opts.Webhook, &pushTrigger{client: mgr.GetClient(), root: d.root, enqueue: pushes, elected: mgr.Elected(), shard: shard, sources: r.sources, logger: mgr.GetLogger()})
		if err != nil {
			return nil, fmt.Errorf("new daemon: %w", err)
		}
		if err := mgr.Add(srv); err != nil {
			return nil, fmt.Errorf("new daemon: add webhook receiver: %w", err)
		}
		d.webhook = srv
	}
	return d, nil
}

// WebhookURL is the base URL of the push receiver (append github, gitlab,
// gitea or generic), or "" without one.
func (d *Daemon) WebhookURL() string {
	if d.webhook == nil {
		return ""
	}
	return "http://" + d.webhook.listener.Addr().String() + WebhookPath
}

// cacheSyncProbeTimeout bounds how long /readyz waits for the caches;
// apiServerProbeTimeout how long it waits for the API server's answer.
const (
	cacheSyncProbeTimeout = time.Second
	apiServerProbeTimeout = 2 * time.Second
)

// addProbes serves /healthz (the process answers) and /readyz: the
// ClusterDeployment informer and every other informer have synced, so the
// controller works on what the cluster holds, not on an empty view; and
// the API server answers now. Synced informers alone would pass while the
// API server is down, as caches stay synced through an outage.
func addProbes(mgr manager.Manager, config *rest.Config) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("add healthz check: %w", err)
	}
	err := mgr.AddReadyzCheck("informers-synced", func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), cacheSyncProbeTimeout)
		defer cancel()
		// GetInformer reaches the API server for the kind's mapping, so an
		// unreachable API server fails here.
		inf, err := mgr.GetCache().GetInformer(ctx, &capstanv1.ClusterDeployment{}, cache.BlockUntilSynced(false))
		if err != nil {
			return fmt.Errorf("ClusterDeployment informer: %w", err)
		}
		if !inf.HasSynced() || !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("informer caches not synced yet")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("add readyz check: %w", err)
	}
	check, err := apiServerCheck(config)
	if err != nil {
		return fmt.Errorf("add readyz check: %w", err)
	}
	if err := mgr.AddReadyzCheck("api-server", check); err != nil {
		return fmt.Errorf("add readyz check: %w", err)
	}
	return nil
}

// apiServerCheck returns a readiness check that asks the API server's own
// /readyz through the daemon's credentials (every authenticated user may
// read it): one cheap GET, no list, bounded by apiServerProbeTimeout.
func apiServerCheck(config *rest.Config) (healthz.Checker, error) {
	disco, err := discovery.NewDiscoveryClientForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), apiServerProbeTimeout)
		defer cancel()
		if err := disco.RESTClient().Get().AbsPath("/readyz").Do(ctx).Error(); err != nil {
			return fmt.Errorf("API server %s does not answer /readyz: %w", config.Host, err)
		}
		return nil
	}, nil
}

// RootStatus reports what the root source last did; the zero value when
// the daemon runs without one.
func (d *Daemon) RootStatus() RootStatus {
	if d.root == nil {
		return RootStatus{}
	}
	return d.root.status()
}

// Identity is this daemon's name in the leader Lease.
func (d *Daemon) Identity() string { return d.identity }

// Elected is closed once this daemon leads (at once without leader
// election).
func (d *Daemon) Elected() <-chan struct{} { return d.manager.Elected() }

// Reconciler returns the daemon's reconciler (for its Stats).
func (d *Daemon) Reconciler() *Reconciler { return d.reconciler }

// Run serves until ctx ends or Close is called.
func (d *Daemon) Run(ctx context.Context) error {
	defer close(d.done)
	defer d.reconciler.sources.close() // the artifacts on disk
	if d.logger.GetSink() != nil {
		// What the manager runs itself logs through this context; the
		// runnables it was given get theirs from BaseContext (New).
		ctx = log.IntoContext(ctx, d.logger)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-d.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	go func() {
		select {
		case <-d.manager.Elected():
			d.manager.GetLogger().WithName("leader").Info("leading: this replica acts now", "identity", d.identity)
		case <-ctx.Done():
		}
	}()
	if err := d.manager.Start(ctx); err != nil {
		return fmt.Errorf("daemon stopped: %w (with leader election on, a replica that lost its Lease exits and is restarted)", err)
	}
	return nil
}

// Close stops a running daemon and waits until Run has returned, at most
// 30 s. Call it only after Run was started.
func (d *Daemon) Close() error {
	d.stopOnce.Do(func() { close(d.stop) })
	select {
	case <-d.done:
		return nil
	case <-time.After(30 * time.Second):
		return errors.New("close daemon: still running after 30s")
	}
}

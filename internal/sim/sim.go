package sim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// Options configure a Simulator.
type Options struct {
	// Namespace limits the simulator to one namespace. Empty means every
	// namespace.
	Namespace string

	// Delays is how long each simulated step takes.
	Delays Delays

	// Faults injects failures into BareMetalHosts, by host name ("node-2",
	// any namespace) or "namespace/name". SetFault and ClearFault change
	// them while the simulator runs.
	Faults map[string]Fault

	// ProviderIDs chooses the providerID CAPM3 gives a machine. The zero
	// value is ProviderIDHostUID, metal3://<BareMetalHost metadata.uid>.
	ProviderIDs ProviderIDFormat

	// Logger receives one line per event and, at V(1), the simulator's
	// retries. The zero value discards.
	Logger logr.Logger

	// Events, when set, is called once for every change the simulator
	// makes, in order, never twice at once. It runs on the simulator's
	// workers and holds them up: keep it short.
	Events func(Event)

	// Workers is how many namespaces are simulated at once. Zero means 2.
	Workers int

	// Kubeconfig, when set, makes the simulated KubeadmControlPlane
	// controller write each Cluster's kubeconfig Secret,
	// <cluster>-kubeconfig, with what it returns for the Cluster (nil: no
	// Secret), as Cluster API does once the Cluster's endpoint is known.
	// A test points it at a second control plane that stands for the
	// workload cluster. Unset, no kubeconfig Secret is written.
	Kubeconfig KubeconfigFunc
}

// DefaultOptions returns options for `capstan dev`: every namespace, demo
// delays, no faults.
func DefaultOptions() Options {
	return Options{Delays: DemoDelays()}
}

// TestOptions returns options for a test confined to one namespace: short
// delays, no faults.
func TestOptions(namespace string) Options {
	return Options{Namespace: namespace, Delays: TestDelays()}
}

// Simulator plays the Cluster API, kubeadm, CAPM3 and BareMetal Operator
// controllers against one API server. Create it with New and start it with
// Run.
type Simulator struct {
	opts   Options
	delays Delays
	log    logr.Logger

	cache  cache.Cache
	client client.Client // reads from the cache, waiting for its own writes
	api    client.Client // reads and writes Secrets, which are not cached
	queue  workqueue.TypedRateLimitingInterface[string]

	emitMu sync.Mutex // one event at a time, in order

	mu          sync.Mutex
	started     bool
	faults      map[string]Fault
	failed      map[types.UID]bool                 // hosts whose one failure was played
	since       map[types.UID]map[string]time.Time // when a step was first due, per object
	namespaces  map[string]bool                    // namespaces seen, to wake on a fault change
	notes       map[types.UID]map[string]bool      // one-off events already sent
	named       map[string]bool                    // child names handed out, "namespace/name"
	servedKinds map[schema.GroupVersionKind]bool   // kinds the API server serves
}

// New returns a Simulator for the API server cfg points at. It connects
// to nothing until Run.
func New(cfg *rest.Config, opts Options) (*Simulator, error) {
	if cfg == nil {
		return nil, errors.New("new simulator: no rest config")
	}
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("new simulator: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.UserAgent == "" {
		cfg.UserAgent = "capstan-sim"
	}
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("new simulator: %w", err)
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("new simulator: %w", err)
	}
	cacheOpts := cache.Options{HTTPClient: httpClient, Mapper: mapper}
	if opts.Namespace != "" {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{opts.Namespace: {}}
	}
	c, err := cache.New(cfg, cacheOpts)
	if err != nil {
		return nil, fmt.Errorf("new simulator: %w", err)
	}
	cl, err := client.New(cfg, client.Options{
		HTTPClient: httpClient,
		Mapper:     mapper,
		Cache: &client.CacheOptions{
			Reader:       c,
			Unstructured: true,
			// A pass must see what the previous pass wrote, or it would
			// create a Machine twice or claim a host twice.
			EnableReadYourWritesConsistency: ptr.To(true),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("new simulator: %w", err)
	}
	// Secrets go straight to the API server: the simulator only checks that
	// one exists and has no reason to hold every Secret in memory.
	api, err := client.New(cfg, client.Options{HTTPClient: httpClient, Mapper: mapper})
	if err != nil {
		return nil, fmt.Errorf("new simulator: %w", err)
	}
	log := opts.Logger
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	s := &Simulator{
		opts:        opts,
		delays:      opts.Delays.withDefaults(),
		log:         log,
		cache:       c,
		client:      cl,
		api:         api,
		faults:      map[string]Fault{},
		failed:      map[types.UID]bool{},
		since:       map[types.UID]map[string]time.Time{},
		namespaces:  map[string]bool{},
		notes:       map[types.UID]map[string]bool{},
		named:       map[string]bool{},
		servedKinds: map[schema.GroupVersionKind]bool{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](20*time.Millisecond, 5*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "capstan-sim"},
		),
	}
	for host, f := range opts.Faults {
		s.faults[host] = f
	}
	return s, nil
}

func (o Options) validate() error {
	var errs []error
	if err := o.Delays.validate(); err != nil {
		errs = append(errs, err)
	}
	for host, f := range o.Faults {
		if err := f.validate(); err != nil {
			errs = append(errs, fmt.Errorf("faults[%s]: %w", host, err))
		}
	}
	if err := o.ProviderIDs.validate(); err != nil {
		errs = append(errs, err)
	}
	if o.Workers < 0 {
		errs = append(errs, fmt.Errorf("workers %d is negative", o.Workers))
	}
	return errors.Join(errs...)
}

// Run simulates the controllers until ctx ends, and returns nil then. It
// fails at once when a kind it plays is not served (a CRD is missing).
// A Simulator runs once.
func (s *Simulator) Run(parent context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("run simulator: already started")
	}
	s.started = true
	s.mu.Unlock()
	defer s.queue.ShutDown()

	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	// The informers log through the context's logger.
	ctx = logr.NewContext(ctx, s.log.V(1).WithName("informers"))

	cacheDone := make(chan error, 1)
	go func() { cacheDone <- s.cache.Start(ctx) }()
	if err := s.watch(ctx); err != nil {
		cancel()
		<-cacheDone
		return fmt.Errorf("run simulator: %w", err)
	}
	if !s.cache.WaitForCacheSync(ctx) {
		cancel()
		err := <-cacheDone
		if parent.Err() != nil {
			return nil
		}
		return fmt.Errorf("run simulator: caches did not sync: %w", err)
	}
	s.log.Info("simulator started", "namespace", s.opts.Namespace, "delays", s.delays)

	workers := s.opts.Workers
	if workers == 0 {
		workers = 2
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for s.next(ctx) {
			}
		})
	}
	<-ctx.Done()
	s.queue.ShutDown()
	wg.Wait()
	if err := <-cacheDone; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("run simulator: %w", err)
	}
	return nil
}

// served reports whether the API server serves gvk, as found by Run.
func (s *Simulator) served(gvk schema.GroupVersionKind) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.servedKinds[gvk]
}

// watch registers an informer per simulated kind; every change to one of
// them queues its namespace for a pass.
func (s *Simulator) watch(ctx context.Context) error {
	var errs []error
	var missing []string
	for _, gvk := range watchedKinds {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		inf, err := s.cache.GetInformer(ctx, u, cache.BlockUntilSynced(false))
		switch {
		case err != nil && meta.IsNoMatchError(err) && optionalKinds[gvk]:
			s.log.Info("kind not served, not simulated", "kind", gvk.GroupKind().String())
			continue
		case err != nil && meta.IsNoMatchError(err):
			missing = append(missing, gvk.Kind+"."+gvk.Group+"/"+gvk.Version)
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("watch %s: %w", gvk.GroupKind(), err))
			continue
		}
		s.mu.Lock()
		s.servedKinds[gvk] = true
		s.mu.Unlock()
		_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    s.changed,
			UpdateFunc: func(_, obj any) { s.changed(obj) },
			DeleteFunc: s.deleted,
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("watch %s: %w", gvk.GroupKind(), err))
		}
	}
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("the API server does not serve %s: install the CRDs of Cluster API v1.14 and CAPM3 v1.13 (testenv.ProviderCRDDirs)",
			strings.Join(missing, ", ")))
	}
	return errors.Join(errs...)
}

func (s *Simulator) changed(obj any) {
	if o, ok := obj.(client.Object); ok {
		s.wake(o.GetNamespace())
	}
}

func (s *Simulator) deleted(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	o, ok := obj.(client.Object)
	if !ok {
		return
	}
	s.mu.Lock()
	delete(s.since, o.GetUID())
	delete(s.notes, o.GetUID())
	delete(s.failed, o.GetUID())
	s.mu.Unlock()
	s.wake(o.GetNamespace())
}

// wake queues a pass over namespace ns.
func (s *Simulator) wake(ns string) {
	if ns == "" {
		return
	}
	s.mu.Lock()
	s.namespaces[ns] = true
	s.mu.Unlock()
	s.queue.Add(ns)
}

// wakeAll queues a pass over every namespace seen so far.
func (s *Simulator) wakeAll() {
	s.mu.Lock()
	nss := make([]string, 0, len(s.namespaces))
	for ns := range s.namespaces {
		nss = append(nss, ns)
	}
	s.mu.Unlock()
	for _, ns := range nss {
		s.wake(ns)
	}
}

// next runs one pass from the queue; it returns false once the queue is
// shut down.
func (s *Simulator) next(ctx context.Context) bool {
	ns, quit := s.queue.Get()
	if quit {
		return false
	}
	defer s.queue.Done(ns)
	wake, err := s.pass(ctx, ns)
	switch {
	case ctx.Err() != nil:
	case err != nil:
		if onlyConflicts(err) {
			s.log.V(1).Info("pass hit a conflict, retrying", "namespace", ns, "error", err.Error())
		} else {
			s.log.Error(err, "simulate namespace, retrying", "namespace", ns)
		}
		s.queue.AddRateLimited(ns)
	default:
		s.queue.Forget(ns)
		if wake > 0 {
			s.queue.AddAfter(ns, wake)
		}
	}
	return true
}

// onlyConflicts reports whether every error joined in err is a write
// conflict or a vanished object, which the next pass resolves by itself.
func onlyConflicts(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !onlyConflicts(e) {
				return false
			}
		}
		return true
	}
	return apierrors.IsConflict(err) || apierrors.IsNotFound(err) || apierrors.IsAlreadyExists(err)
}

package reconciler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/capstan-dev/capstan/stages"
)

// watchConn is a connection to one cluster as the drift watcher uses it:
// metadata-only lists and watches, and the cluster's REST mapping.
type watchConn struct {
	// name says which cluster this is in logs: "local", or the API
	// server's address; never credentials.
	name   string
	meta   metadata.Interface
	mapper meta.RESTMapper
	// release frees what the connection holds once its watches ended;
	// nil when there is nothing to free.
	release func()
}

// restConfigured is a connection that says how it reaches its cluster, as
// the connections stages builds from kubeconfigs do.
type restConfigured interface{ RESTConfig() *rest.Config }

// watchConnTo makes the watch connection of c, a connection to a cluster
// reached through a kubeconfig. Nothing is requested from the cluster.
func watchConnTo(c stages.Cluster) (watchConn, error) {
	rc, ok := c.(restConfigured)
	if !ok {
		return watchConn{}, fmt.Errorf("the connection to %s does not say how it reaches its cluster", c.Name())
	}
	cfg := rc.RESTConfig()
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return watchConn{}, fmt.Errorf("build an HTTP client for %s (check its certificates and keys): %w", c.Name(), err)
	}
	mc, err := metadata.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return watchConn{}, fmt.Errorf("build a metadata client for %s: %w", c.Name(), err)
	}
	return watchConn{name: cfg.Host, meta: mc, mapper: c.RESTMapper(), release: httpClient.CloseIdleConnections}, nil
}

// driftSink is told what the watches of one cluster see.
type driftSink interface {
	// changed says that obj, of kind gk in cw's cluster, was deleted or
	// taken over or stripped of fields Capstan manages (what).
	changed(cw *clusterWatch, gk schema.GroupKind, obj any, what string)
	// synced says that cw holds every object of kind gk: those of the
	// deployments it is watched for that are absent (by store key) went
	// while no one watched.
	synced(cw *clusterWatch, gk schema.GroupKind, absent func(key string) bool)
}

// clusterWatch holds the drift watches of one cluster: one metadata
// informer per kind, limited to objects with Capstan's owner label and
// shared by every deployment that applied objects of that kind there.
// Nothing it does blocks its caller: a kind is mapped and its informer
// started and synced in the background, retried while the cluster cannot
// be reached, until stop.
type clusterWatch struct {
	conn   watchConn
	sink   driftSink
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// done is closed once every goroutine of a stopped watch ended.
	done     chan struct{}
	stopOnce sync.Once

	mu    sync.Mutex
	kinds map[schema.GroupKind]*kindWatch
}

// kindWatch is the informer of one kind, once it holds the kind's objects.
type kindWatch struct {
	synced chan struct{} // closed once store holds the kind's objects
	store  cache.Store   // set before synced is closed
}

func newClusterWatch(parent context.Context, conn watchConn, sink driftSink) *clusterWatch {
	ctx, cancel := context.WithCancel(parent)
	return &clusterWatch{conn: conn, sink: sink, ctx: ctx, cancel: cancel, done: make(chan struct{}), kinds: map[schema.GroupKind]*kindWatch{}}
}

// watch makes sure kind gk (at version, to map it) is watched, and returns
// its watch; nil once the cluster watch stopped.
func (cw *clusterWatch) watch(gk schema.GroupKind, version string) *kindWatch {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	if cw.ctx.Err() != nil {
		return nil
	}
	if kw, ok := cw.kinds[gk]; ok {
		return kw
	}
	kw := &kindWatch{synced: make(chan struct{})}
	cw.kinds[gk] = kw
	cw.wg.Add(1)
	go func() {
		defer cw.wg.Done()
		cw.run(gk, version, kw)
	}()
	return kw
}

// storeOf returns the objects of kind gk once its informer synced.
func (kw *kindWatch) storeOf() (cache.Store, bool) {
	select {
	case <-kw.synced:
		return kw.store, true
	default:
		return nil, false
	}
}

// driftWatchSynced is logged (at V(1)) once the informer of a kind holds
// its objects.
const driftWatchSynced = "drift watch synced"

// mapRetryMax caps the wait between attempts at mapping a kind of a
// cluster that cannot be reached.
const mapRetryMax = unreachableRetryMax

// run maps gk, starts its informer and, once synced, tells the sink.
func (cw *clusterWatch) run(gk schema.GroupKind, version string, kw *kindWatch) {
	logger := log.FromContext(cw.ctx).WithValues("cluster", cw.conn.name, "kind", gk.String())
	mapping, err := cw.mapKind(gk, version, logger)
	if err != nil {
		if cw.ctx.Err() == nil {
			// Not served (a CRD removed): a later track or reconnect tries again.
			logger.Info("cannot watch applied objects for drift", "error", err.Error())
			cw.mu.Lock()
			delete(cw.kinds, gk)
			cw.mu.Unlock()
		}
		return
	}
	inf := cache.NewSharedIndexInformer(cw.listWatch(mapping.Resource, logger), &metav1.PartialObjectMetadata{}, 0, cache.Indexers{})
	// listed holds the objects of the first list: one of them deleted
	// before the sync is over is told by its event, not found missing.
	listed := map[string]bool{}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if key, kerr := cache.MetaNamespaceKeyFunc(obj); kerr == nil && initial {
				listed[key] = true
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			if what := fieldsDrift(oldObj, newObj); what != "" {
				cw.sink.changed(cw, gk, newObj, what)
			}
		},
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			cw.sink.changed(cw, gk, obj, "deleted")
		},
	})
	if err == nil {
		// Failed lists and watches are logged by listWatch; this handler
		// only replaces client-go's, which logs them again.
		err = inf.SetWatchErrorHandlerWithContext(func(context.Context, *cache.Reflector, error) {})
	}
	if err != nil {
		logger.Info("cannot watch applied objects for drift", "error", err.Error())
		return
	}
	cw.wg.Add(1)
	go func() {
		defer cw.wg.Done()
		inf.RunWithContext(cw.ctx)
	}()
	// The handler's sync: every object of the first list reached it.
	if !cache.WaitForCacheSync(cw.ctx.Done(), reg.HasSynced) {
		return
	}
	store := inf.GetStore()
	kw.store = store
	close(kw.synced)
	// From here on every write to the kind reaches the handler; one made
	// before was listed as it is, with nothing to compare it to.
	logger.V(1).Info(driftWatchSynced)
	cw.sink.synced(cw, gk, func(key string) bool {
		_, exists, _ := store.GetByKey(key)
		return !exists && !listed[key]
	})
}

// listWatch lists and watches the objects of resource gvr that carry
// Capstan's owner label, through cw's connection. The informer retries
// failed calls with its own backoff (a refused watch silently); the log
// says when the cluster stops answering and when it answers again, once
// each, and the deployments' state stays as it is.
func (cw *clusterWatch) listWatch(gvr schema.GroupVersionResource, logger logr.Logger) cache.ListerWatcher {
	var failing atomic.Bool
	seen := func(err error) {
		switch {
		case err == nil:
			if failing.Swap(false) {
				logger.Info("drift watch reaches its cluster again")
			}
		case cw.ctx.Err() == nil && !failing.Swap(true):
			logger.Info("drift watch cannot list or watch; retrying", "error", err.Error())
		}
	}
	owned := func(o metav1.ListOptions) metav1.ListOptions {
		o.LabelSelector = stages.OwnerNameLabel
		return o
	}
	resource := cw.conn.meta.Resource(gvr)
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			list, err := resource.List(ctx, owned(o))
			seen(err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := resource.Watch(ctx, owned(o))
			seen(err)
			return w, err
		},
	}
}

// mapKind maps gk to its resource, retrying with backoff while the
// cluster does not answer (logged when it starts and when it ends). A kind
// the cluster does not serve is an error.
func (cw *clusterWatch) mapKind(gk schema.GroupKind, version string, logger logr.Logger) (*meta.RESTMapping, error) {
	wait := time.Second
	for failed := false; ; failed = true {
		mapping, err := cw.conn.mapper.RESTMapping(gk, version)
		if err == nil || meta.IsNoMatchError(err) {
			if failed && err == nil {
				logger.Info("drift watch reaches its cluster again")
			}
			return mapping, err
		}
		if !failed {
			logger.Info("drift watch cannot reach its cluster; retrying", "error", err.Error())
		}
		select {
		case <-cw.ctx.Done():
			return nil, cw.ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, mapRetryMax)
	}
}

// normalWatchEnd reports whether err only ends a watch that the informer
// starts again at once, as client-go's default handler judges it.
func normalWatchEnd(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

// stop ends the cluster's watches; their goroutines finish in the
// background, and then the connection's idle HTTP connections are closed.
func (cw *clusterWatch) stop() {
	cw.stopOnce.Do(func() {
		cw.mu.Lock()
		cw.cancel()
		cw.mu.Unlock()
		go func() {
			cw.wg.Wait()
			if cw.conn.release != nil {
				cw.conn.release()
			}
			close(cw.done)
		}()
	})
}

package stages

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// changeFeed merges metadata-only watches of several kinds into one
// wake-up signal. An event carries no state the rollout uses: on every
// signal it reads the cluster afresh, so a missed or repeated event costs
// at most one extra read, and a restarted daemon needs no memory of it.
type changeFeed struct {
	client   client.WithWatch
	ctx      context.Context
	cancel   context.CancelFunc
	wake     chan struct{}
	mu       sync.Mutex
	followed map[string]bool
	wg       sync.WaitGroup
}

func newChangeFeed(ctx context.Context, c client.WithWatch) *changeFeed {
	ctx, cancel := context.WithCancel(ctx)
	return &changeFeed{client: c, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), followed: map[string]bool{}}
}

// follow signals every change of the kind's objects in namespace (all
// namespaces when empty) from now on. The starting point is fixed before
// follow returns, so a change made after it is never missed.
func (f *changeFeed) follow(gvk schema.GroupVersionKind, namespace string) error {
	key := gvk.String() + "@" + namespace
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.followed[key] {
		return nil
	}
	rv, err := f.resourceVersion(gvk, namespace)
	if err != nil {
		return err
	}
	f.followed[key] = true
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.run(gvk, namespace, rv)
	}()
	return nil
}

// resourceVersion returns the kind's current resource version, listing a
// single object: the watch starts there.
func (f *changeFeed) resourceVersion(gvk schema.GroupVersionKind, namespace string) (string, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	opts := []client.ListOption{client.Limit(1)}
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	if err := f.client.List(f.ctx, list, opts...); err != nil {
		if meta.IsNoMatchError(err) {
			return "", Stalled(fmt.Errorf("watch %s: %w", gvk.Kind, err))
		}
		return "", fmt.Errorf("watch %s: %w", gvk.Kind, err)
	}
	return list.GetResourceVersion(), nil
}

func (f *changeFeed) run(gvk schema.GroupVersionKind, namespace, rv string) {
	backoff := 100 * time.Millisecond
	for f.ctx.Err() == nil {
		if rv == "" {
			var err error
			if rv, err = f.resourceVersion(gvk, namespace); err != nil {
				if !f.sleep(&backoff) {
					return
				}
				continue
			}
			// Whatever changed while no watch was open is read now.
			f.signal()
		}
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		opts := []client.ListOption{&client.ListOptions{Raw: watchOptions(rv)}}
		if namespace != "" {
			opts = append(opts, client.InNamespace(namespace))
		}
		w, err := f.client.Watch(f.ctx, list, opts...)
		rv = ""
		if err != nil {
			if !f.sleep(&backoff) {
				return
			}
			continue
		}
		backoff = 100 * time.Millisecond
		f.forward(w)
		w.Stop()
	}
}

// forward signals every event of w until it ends.
func (f *changeFeed) forward(w watch.Interface) {
	for {
		select {
		case <-f.ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok || ev.Type == watch.Error {
				return
			}
			if ev.Type != watch.Bookmark {
				f.signal()
			}
		}
	}
}

func (f *changeFeed) sleep(backoff *time.Duration) bool {
	select {
	case <-f.ctx.Done():
		return false
	case <-time.After(*backoff):
	}
	*backoff = min(*backoff*2, 5*time.Second)
	return true
}

func (f *changeFeed) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// stop ends every watch and waits for them.
func (f *changeFeed) stop() {
	f.cancel()
	f.wg.Wait()
}

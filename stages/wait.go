package stages

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Wait blocks until the checker finds every object ready, or ctx ends. It
// lists each kind and namespace once, then follows watch events, so a stage
// that becomes ready is seen within one event, not a polling interval. When
// ctx ends first, the verdict is not ready and says what is still awaited;
// that is not an error.
func (e *Executor) Wait(ctx context.Context, objects []*unstructured.Unstructured, checker *Checker, owner Owner) (Verdict, error) {
	if len(objects) == 0 {
		return Verdict{Ready: true}, nil
	}
	return e.waitUntilReady(ctx, objects, checker, owner)
}

type objectKey struct {
	gvk             schema.GroupVersionKind
	namespace, name string
}

func (k objectKey) String() string {
	if k.namespace != "" {
		return k.gvk.Kind + "/" + k.namespace + "/" + k.name
	}
	return k.gvk.Kind + "/" + k.name
}

type groupKey struct {
	gvk       schema.GroupVersionKind
	namespace string
}

type observation struct {
	key     objectKey
	object  *unstructured.Unstructured // nil when deleted or absent
	err     error
	deleted bool
}

func (e *Executor) waitUntilReady(ctx context.Context, objects []*unstructured.Unstructured, checker *Checker, owner Owner) (Verdict, error) {
	pending := make(map[objectKey]string, len(objects))
	groups := map[groupKey]map[string]bool{}
	for _, obj := range objects {
		// Read in the version the checks are written for: the API server
		// converts from the version the object was applied in.
		k := objectKey{gvk: checker.ReadAs(obj.GroupVersionKind()), namespace: obj.GetNamespace(), name: obj.GetName()}
		pending[k] = "not found"
		g := groupKey{gvk: k.gvk, namespace: k.namespace}
		if groups[g] == nil {
			groups[g] = map[string]bool{}
		}
		groups[g][k.name] = true
	}

	total := len(pending)
	counts := map[objectKey]replicaCount{} // of the objects that roll out replicas
	watchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	observations := make(chan observation)
	for g, names := range groups {
		go e.follow(watchCtx, g, names, owner, observations)
	}
	for {
		if len(pending) == 0 {
			return Verdict{Ready: true, ReadyObjects: total}, nil
		}
		select {
		case <-ctx.Done():
			return Verdict{Message: summarize(pending), ReadyObjects: total - len(pending), Replicas: replicaProgress(pending, counts)}, nil
		case o := <-observations:
			switch {
			case o.err != nil:
				return Verdict{}, o.err
			case o.deleted:
				pending[o.key] = "not found"
				delete(counts, o.key)
			default:
				if c, ok := replicasOf(o.object); ok {
					counts[o.key] = c
				}
				if v := checker.Evaluate(o.object); v.Err != nil {
					return Verdict{}, v.Err
				} else if v.Ready {
					delete(pending, o.key)
				} else {
					pending[o.key] = v.Message
				}
			}
		}
	}
}

// follow lists one kind in one namespace, reports the named objects, then
// watches from the list's resource version, listing again whenever the
// watch ends. It stops when ctx ends.
func (e *Executor) follow(ctx context.Context, g groupKey, names map[string]bool, owner Owner, out chan<- observation) {
	send := func(o observation) bool {
		select {
		case out <- o:
			return true
		case <-ctx.Done():
			return false
		}
	}
	listGVK := g.gvk.GroupVersion().WithKind(g.gvk.Kind + "List")
	backoff := 100 * time.Millisecond
	// retry waits out a transient error before listing again; the stage
	// keeps waiting. It returns false when ctx ends first.
	retry := func() bool {
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return false
		}
		backoff = min(backoff*2, 5*time.Second)
		return true
	}
	for ctx.Err() == nil {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(listGVK)
		opts := []client.ListOption{client.MatchingLabels{
			OwnerGroup + "/name":      owner.Name,
			OwnerGroup + "/namespace": owner.Namespace,
		}}
		if g.namespace != "" {
			opts = append(opts, client.InNamespace(g.namespace))
		}
		if err := e.client.List(ctx, list, opts...); err != nil {
			if ctx.Err() != nil {
				return
			}
			if meta.IsNoMatchError(err) {
				send(observation{err: Stalled(fmt.Errorf("watch %s: %w", g.gvk.Kind, err))})
				return
			}
			if e.remote() && isNetworkError(err) {
				// A remote cluster that went away: say so now, rather
				// than wait out the slice on what was last seen.
				send(observation{err: fmt.Errorf("list %s: %w", g.gvk.Kind, err)})
				return
			}
			if !retry() {
				return
			}
			continue
		}
		seen := map[string]bool{}
		for i := range list.Items {
			item := &list.Items[i]
			if !names[item.GetName()] {
				continue
			}
			seen[item.GetName()] = true
			if !send(observation{key: keyOf(g, item.GetName()), object: item}) {
				return
			}
		}
		for name := range names {
			if !seen[name] && !send(observation{key: keyOf(g, name), deleted: true}) {
				return
			}
		}
		watchList := &unstructured.UnstructuredList{}
		watchList.SetGroupVersionKind(listGVK)
		w, err := e.client.Watch(ctx, watchList, append(opts, &client.ListOptions{Raw: watchOptions(list.GetResourceVersion())})...)
		if err != nil {
			if e.remote() && isNetworkError(err) {
				send(observation{err: fmt.Errorf("watch %s: %w", g.gvk.Kind, err)})
				return
			}
			// Back off as for a failed list, or a watch that cannot be
			// opened (RBAC without watch) turns into a hot loop of lists.
			if !retry() {
				return
			}
			continue
		}
		backoff = 100 * time.Millisecond
		e.drain(ctx, w, g, names, send)
		w.Stop()
	}
}

func (e *Executor) drain(ctx context.Context, w watch.Interface, g groupKey, names map[string]bool, send func(observation) bool) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			obj, isUnstructured := ev.Object.(*unstructured.Unstructured)
			if !isUnstructured || ev.Type == watch.Error || ev.Type == watch.Bookmark {
				if ev.Type == watch.Error {
					return // relist, e.g. after "resource version too old"
				}
				continue
			}
			if !names[obj.GetName()] {
				continue
			}
			o := observation{key: keyOf(g, obj.GetName()), object: obj, deleted: ev.Type == watch.Deleted}
			if !send(o) {
				return
			}
		}
	}
}

func keyOf(g groupKey, name string) objectKey {
	return objectKey{gvk: g.gvk, namespace: g.namespace, name: name}
}

// summarize names the first object still awaited and how many more are.
func summarize(pending map[objectKey]string) string {
	keys := make([]objectKey, 0, len(pending))
	for k := range pending {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	var b strings.Builder
	fmt.Fprintf(&b, "waiting for %s: %s", keys[0], pending[keys[0]])
	if n := len(keys) - 1; n > 0 {
		fmt.Fprintf(&b, " (and %d more)", n)
	}
	return b.String()
}

func watchOptions(resourceVersion string) *metav1.ListOptions {
	return &metav1.ListOptions{ResourceVersion: resourceVersion, AllowWatchBookmarks: true}
}

package reconciler

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/sources"
)

// stuckSource is a remote that never answers before its caller gives
// up: its operations end only with their context.
type stuckSource struct{ url string }

func (s *stuckSource) URL() string { return s.url }

func (s *stuckSource) Revision(ctx context.Context) (string, error) {
	<-ctx.Done()
	return "", ctx.Err()
}

func (s *stuckSource) Fetch(ctx context.Context) (*sources.Artifact, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A reconcile never waits for a source: a stuck source answers "pending"
// at once, and a healthy source answers its own deployment meanwhile.
// The deployments waiting for the stuck one are woken when its deadline
// cuts it, each with the timeout naming the source.
func TestStuckSourceHoldsNoReconcile(t *testing.T) {
	c := newTestSourceCache(t, ArtifactOptions{})
	woken := make(chan types.NamespacedName, 16)
	c.wake = func(user types.NamespacedName) { woken <- user }
	a, b, healthy := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"},
		types.NamespacedName{Namespace: "ns", Name: "healthy"}
	entry := func(user types.NamespacedName, key string, src sources.Source) *sourceEntry {
		e, err := c.get(key, user, func() (sources.Source, error) { return src, nil })
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	// Wakes arrive in any order: one seen while waiting for another is
	// kept for its own wait, never dropped.
	seen := map[types.NamespacedName]int{}
	wakeOf := func(want types.NamespacedName) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for seen[want] == 0 {
			select {
			case user := <-woken:
				seen[user]++
			case <-deadline:
				t.Fatalf("%s not woken", want.Name)
			}
		}
		seen[want]--
	}

	// Stuck for as long as the test runs.
	stuck := &stuckSource{url: "https://stuck.example/infra.git"}
	if ans, pending := entry(a, "stuck", stuck).revisionFor(a, time.Minute, time.Hour); !pending {
		t.Fatalf("check of a stuck source = %+v; want pending at once", ans)
	}
	fast := entry(healthy, "fast", &diskSource{dir: c.store.Dir()})
	if ans, pending := fast.revisionFor(healthy, time.Minute, time.Hour); !pending {
		t.Fatalf("first check of a healthy source = %+v; want pending", ans)
	}
	wakeOf(healthy)
	if ans, pending := fast.revisionFor(healthy, time.Minute, time.Hour); pending || ans.err != nil || ans.revision != "r1" {
		t.Errorf("check of a healthy source while another is stuck = %+v, pending %v; want r1", ans, pending)
	}

	// Cut by its deadline.
	slow := &stuckSource{url: "https://slow.example/infra.git"}
	const limit = 300 * time.Millisecond
	for _, user := range []types.NamespacedName{a, b} {
		if ans, pending := entry(user, "slow", slow).revisionFor(user, time.Minute, limit); !pending {
			t.Fatalf("%s: check of a slow source = %+v; want pending at once", user.Name, ans)
		}
	}
	for _, user := range []types.NamespacedName{a, b} {
		wakeOf(user)
		ans, pending := entry(user, "slow", slow).revisionFor(user, time.Minute, limit)
		err := ans.err
		if pending || err == nil {
			t.Fatalf("%s after the wake: pending %v, %v; want the timeout", user.Name, pending, err)
		}
		if !strings.Contains(err.Error(), "revision check of https://slow.example/infra.git did not finish within 300ms (spec.timeout)") {
			t.Errorf("%s: %v; want it to name the source, the time and spec.timeout", user.Name, err)
		}
		if failure.ReasonOf(err, "") != sources.ReasonSourceTimeout || failure.PolicyOf(err) != failure.PolicyRetry {
			t.Errorf("%s: reason %s, policy %s; want %s, retried", user.Name, failure.ReasonOf(err, ""), failure.PolicyOf(err), sources.ReasonSourceTimeout)
		}
	}
	// Taken once: the next attempt asks the remote again.
	if _, pending := entry(a, "slow", slow).revisionFor(a, time.Minute, limit); !pending {
		t.Error("a failed check's answer was handed out twice; the next attempt must ask again")
	}
}

// A deployment that started a fetch, and one that joined it, take its
// artifact at their next attempt; the fetch counts once.
func TestFetchIsSharedAndCountedOnce(t *testing.T) {
	c := newTestSourceCache(t, ArtifactOptions{})
	woken := make(chan types.NamespacedName, 2)
	c.wake = func(user types.NamespacedName) { woken <- user }
	src := &gatedSource{diskSource: diskSource{dir: c.store.Dir()}, gate: make(chan struct{})}
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	var e *sourceEntry
	for _, user := range []types.NamespacedName{a, b} {
		var err error
		if e, err = c.get("repo", user, func() (sources.Source, error) { return src, nil }); err != nil {
			t.Fatal(err)
		}
		if ans, pending := e.fetchFor(user, "r1", time.Minute); !pending {
			t.Fatalf("%s: fetch = %+v; want pending", user.Name, ans)
		}
	}
	close(src.gate)
	for range 2 {
		select {
		case <-woken:
		case <-time.After(10 * time.Second):
			t.Fatal("not woken after the fetch")
		}
	}
	fetchedBy := 0
	for _, user := range []types.NamespacedName{a, b} {
		ans, pending := e.fetchFor(user, "r1", time.Minute)
		if pending || ans.err != nil || ans.artifact == nil || ans.artifact.Revision != "r1" {
			t.Fatalf("%s after the wake: %+v, pending %v; want the artifact", user.Name, ans, pending)
		}
		if ans.fetched {
			fetchedBy++
		}
	}
	if n := src.fetches.Load(); n != 1 || fetchedBy != 1 {
		t.Errorf("fetched %d times, counted by %d deployments; want once, counted once", n, fetchedBy)
	}
}

// gatedSource is a diskSource whose fetch waits for its gate.
type gatedSource struct {
	diskSource
	gate chan struct{}
}

func (s *gatedSource) Fetch(ctx context.Context) (*sources.Artifact, error) {
	select {
	case <-s.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.diskSource.Fetch(ctx)
}

// The root source serves the deployments without a source of Capstan's
// namespace, of the namespace root deployments are created in, and of
// those --root-source-namespaces lists; a tenant's namespace is none.
func TestRootSourceNamespaces(t *testing.T) {
	tests := []struct {
		name      string
		home      string
		opts      RootOptions
		namespace string
		serves    bool
	}{
		{"Capstan's own namespace (the pod's)", "capstan-system", RootOptions{Namespace: "clusters"}, "capstan-system", true},
		{"where root deployments that name none go", "", RootOptions{Namespace: "clusters"}, "clusters", true},
		{"a namespace --root-source-namespaces lists", "capstan-system", RootOptions{Namespace: "capstan-system", Namespaces: []string{"team-a", "team-b"}}, "team-b", true},
		{"a tenant's namespace", "capstan-system", RootOptions{Namespace: "capstan-system", Namespaces: []string{"team-a"}}, "team-c", false},
		{"outside a pod, a tenant's namespace", "", RootOptions{Namespace: "capstan-system"}, "team-a", false},
		{"the empty namespace is never served", "", RootOptions{Namespaces: []string{" "}}, "", false},
		{"no namespace given: capstan-system", "", RootOptions{}, "capstan-system", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &sourceCache{rootNamespaces: rootNamespacesOf(tt.opts, tt.home)}
			if got := c.rootServes(tt.namespace); got != tt.serves {
				t.Errorf("root source serves %q = %v, want %v", tt.namespace, got, tt.serves)
			}
			if !tt.serves {
				err := c.notServed(tt.namespace)
				if !failure.IsStalled(err) || failure.ReasonOf(err, "") != ReasonSourceNotServed {
					t.Errorf("refusal %v: reason %s; want stalled, %s", err, failure.ReasonOf(err, ""), ReasonSourceNotServed)
				}
				if !strings.Contains(err.Error(), "--root-source-namespaces") || !strings.Contains(err.Error(), "spec.source") {
					t.Errorf("refusal %q names neither the flag nor spec.source", err)
				}
			}
		})
	}
}

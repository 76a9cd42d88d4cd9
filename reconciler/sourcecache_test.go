package reconciler

import (
	"context"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/sources"
)

// diskSource hands out artifacts written into the cache's directory, as
// the git and OCI sources do.
type diskSource struct {
	dir     string
	fetches atomic.Int32
}

func (s *diskSource) Revision(context.Context) (string, error) { return "r1", nil }

func (s *diskSource) Fetch(context.Context) (*sources.Artifact, error) {
	s.fetches.Add(1)
	dir, err := os.MkdirTemp(s.dir, "artifact-")
	if err != nil {
		return nil, err
	}
	b, err := sources.NewDiskFS(dir, sources.Limits{})
	if err != nil {
		return nil, err
	}
	if err := b.Add("kustomization.yaml", []byte("resources: [cm.yaml]\n"), 0o644); err != nil {
		return nil, err
	}
	if err := b.Add("cm.yaml", []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n"), 0o644); err != nil {
		return nil, err
	}
	return b.Artifact("r1"), nil
}

func newTestSourceCache(t *testing.T, opts ArtifactOptions) *sourceCache {
	t.Helper()
	opts.CacheDir = t.TempDir()
	c, err := newSourceCache(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.close() })
	return c
}

// Deployments that share a source share its artifact on disk; it goes
// when the last of them is deleted, and so does the source.
func TestSourceCacheDropsWhatDeletedDeploymentsRead(t *testing.T) {
	c := newTestSourceCache(t, ArtifactOptions{})
	src := &diskSource{dir: c.store.Dir()}
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	var art *sources.Artifact
	for _, user := range []types.NamespacedName{a, b} {
		e, err := c.get("git|repo", user, func() (sources.Source, error) { return src, nil })
		if err != nil {
			t.Fatal(err)
		}
		if art, _, err = e.fetch(context.Background(), "r1"); err != nil {
			t.Fatal(err)
		}
	}
	if n := src.fetches.Load(); n != 1 {
		t.Errorf("fetched %d times for two deployments on one revision, want once", n)
	}
	c.forget(a)
	if _, err := os.Stat(art.Dir); err != nil {
		t.Fatalf("the artifact went while b still reads it: %v", err)
	}
	c.forget(b)
	if _, err := os.Stat(art.Dir); !os.IsNotExist(err) {
		t.Errorf("the artifact of deleted deployments is still on disk: %v", err)
	}
	if _, ok := c.lookup("git|repo"); ok {
		t.Error("the source of deleted deployments is still cached")
	}
}

// slowFS counts the renders reading it at once.
type slowFS struct {
	fs.FS
	mu        sync.Mutex
	now, peak int
}

func (s *slowFS) Open(name string) (fs.File, error) {
	if name == "cm.yaml" {
		s.mu.Lock()
		s.now++
		s.peak = max(s.peak, s.now)
		s.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
		s.mu.Lock()
		s.now--
		s.mu.Unlock()
	}
	return s.FS.Open(name)
}

// No more than MaxConcurrentRenders renders run at once, however many
// deployments ask.
func TestRendersRunABoundedNumberAtATime(t *testing.T) {
	c := newTestSourceCache(t, ArtifactOptions{MaxConcurrentRenders: 2})
	r := &Reconciler{sources: c}
	fsys := &slowFS{FS: fstest.MapFS{
		"kustomization.yaml": {Data: []byte("resources: [cm.yaml]\n")},
		"cm.yaml":            {Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n")},
	}}
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			a := &attempt{cd: &capstanv1.ClusterDeployment{}, artifact: &sources.Artifact{Revision: "r1", FS: fsys}}
			if _, err := r.render(context.Background(), a, render.DefaultOptions()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if fsys.peak > 2 {
		t.Errorf("%d renders ran at once, want at most 2", fsys.peak)
	}
}

// An artifact the store evicted after its fetch is fetched again rather
// than rendered from missing files; the attempt keeps it pinned.
func TestEvictedArtifactIsFetchedAgain(t *testing.T) {
	c := newTestSourceCache(t, ArtifactOptions{})
	src := &diskSource{dir: c.store.Dir()}
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}}
	e, err := c.get("git|repo", client.ObjectKeyFromObject(cd), func() (sources.Source, error) { return src, nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.fetch(context.Background(), "r1"); err != nil {
		t.Fatal(err)
	}
	c.store.Drop("git|repo") // as an eviction would
	collector, err := metrics.For(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{sources: c, metrics: collector}
	var a *attempt
	waitUntil(t, "the artifact fetched again", func() bool {
		a = &attempt{cd: cd, source: e, revision: "r1"}
		_, err := r.fetchArtifact(context.Background(), a)
		if err != nil {
			t.Fatal(err)
		}
		return !a.pending
	})
	defer a.unpin()
	res, err := r.render(context.Background(), a, render.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if objs := res.Objects; len(objs) != 1 || src.fetches.Load() != 2 {
		t.Errorf("got %d objects after %d fetches, want 1 object after fetching again", len(res.Objects), src.fetches.Load())
	}
}

// waitUntil polls cond until it holds, or fails t after 10s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

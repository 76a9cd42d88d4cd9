package reconciler

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/sources"
)

// filesSource is a remote whose revision and files the test sets.
type filesSource struct {
	dir     string
	mu      sync.Mutex
	rev     string
	files   map[string]string
	fetches atomic.Int32
}

func (s *filesSource) set(rev string, files map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rev, s.files = rev, files
}

func (s *filesSource) Revision(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rev, nil
}

func (s *filesSource) Fetch(context.Context) (*sources.Artifact, error) {
	s.fetches.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	dir, err := os.MkdirTemp(s.dir, "artifact-")
	if err != nil {
		return nil, err
	}
	b, err := sources.NewDiskFS(dir, sources.Limits{})
	if err != nil {
		return nil, err
	}
	for name, body := range s.files {
		if err := b.Add(name, []byte(body), 0o644); err != nil {
			return nil, err
		}
	}
	return b.Artifact(s.rev), nil
}

func rootDeployment(name, namespace string) string {
	doc := "apiVersion: capstan.dev/v1alpha1\nkind: ClusterDeployment\nmetadata:\n  name: " + name + "\n"
	if namespace != "" {
		doc += "  namespace: " + namespace + "\n"
	}
	return doc + "spec:\n  path: clusters/" + name + "\n"
}

// The root source keeps the ClusterDeployments of its namespace equal to
// those committed under its path: each file's deployment is applied
// (into the root's namespace when it names none) and labelled as the
// root's, one removed from git stops being managed, and a file that does
// not parse deletes nothing: the set it belongs to is incomplete, and
// only a new commit can fix it.
func TestRootSourceSync(t *testing.T) {
	env := controlPlane(t)
	ctx := t.Context()
	if err := testenv.InstallCRDs(ctx, env.Config, "../manifests/crds/capstan.dev_clusterdeployments.yaml"); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, "root-sync")
	if err != nil {
		t.Fatal(err)
	}
	cache := newTestSourceCache(t, ArtifactOptions{})
	src := &filesSource{dir: cache.store.Dir()}
	root, err := newRootSource(RootOptions{URL: "https://git.example/platform/root.git", Path: "clusters", Namespace: ns, Source: src}, c, cache, "")
	if err != nil {
		t.Fatal(err)
	}
	// A deployment of the same namespace that the root did not apply: never
	// the root's to delete.
	other := dependent("by-hand")
	other.Namespace, other.Spec.Source = ns, nil
	if err := c.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	managed := func() []string {
		t.Helper()
		list := &capstanv1.ClusterDeploymentList{}
		if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, cd := range list.Items {
			name := cd.Name
			if cd.Labels[RootLabel] == root.id {
				name += " (root)"
			}
			out = append(out, name)
		}
		slices.Sort(out)
		return out
	}

	src.set("r1", map[string]string{
		"clusters/edge.yaml":  rootDeployment("edge", ""),
		"clusters/core.yaml":  rootDeployment("core", ns),
		"clusters/notes.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: not-a-deployment\n",
		"README.md":           "outside the path\n",
	})
	if err := root.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := managed(), []string{"by-hand", "core (root)", "edge (root)"}; !slices.Equal(got, want) {
		t.Errorf("after r1: %v, want %v", got, want)
	}
	if st := root.status(); st.Revision != "r1" || st.Deployments != 2 {
		t.Errorf("status after r1 = %+v, want r1 with 2 deployments", st)
	}

	src.set("r2", map[string]string{"clusters/edge.yaml": rootDeployment("edge", "")})
	if err := root.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := managed(), []string{"by-hand", "edge (root)"}; !slices.Equal(got, want) {
		t.Errorf("after core was removed from git: %v, want %v", got, want)
	}

	src.set("r3", map[string]string{"clusters/edge.yaml": "apiVersion: capstan.dev/v1alpha1\nkind: ClusterDeployment\nmetadata: [broken\n",
		"clusters/new.yaml": rootDeployment("new", "")})
	err = root.sync(ctx)
	if err == nil || !strings.Contains(err.Error(), "edge.yaml") {
		t.Fatalf("sync of a revision with a broken file = %v; want an error naming clusters/edge.yaml", err)
	}
	if got, want := managed(), []string{"by-hand", "edge (root)", "new (root)"}; !slices.Equal(got, want) {
		t.Errorf("after a broken file: %v, want %v (nothing deleted, what parsed applied)", got, want)
	}
	root.mu.Lock()
	root.lastErr = err
	root.mu.Unlock()
	fetched := src.fetches.Load()
	if again := root.sync(ctx); again == nil || again.Error() != err.Error() {
		t.Errorf("the broken revision synced again = %v, want the same error", again)
	}
	if src.fetches.Load() != fetched {
		t.Error("the broken revision was fetched again; only a new commit can fix it")
	}
	if st := root.status(); st.Revision != "r2" {
		t.Errorf("the last revision synced whole = %q, want r2", st.Revision)
	}
}

// The root source serves deployments without a source of their own only
// in Capstan's namespace, the root's and those listed; any other
// namespace gets a Stalled error that says what to do.
func TestRootNamespaces(t *testing.T) {
	got := rootNamespacesOf(RootOptions{Namespaces: []string{" platform ", ""}}, "capstan")
	want := map[string]bool{"capstan": true, defaultRootNamespace: true, "platform": true}
	if len(got) != len(want) {
		t.Fatalf("rootNamespacesOf = %v, want %v", got, want)
	}
	for ns := range want {
		if !got[ns] {
			t.Errorf("namespace %s is not served: %v", ns, got)
		}
	}
	c := newTestSourceCache(t, ArtifactOptions{})
	c.rootNamespaces = got
	if !c.rootServes("platform") || c.rootServes("team-a") {
		t.Error("rootServes does not follow the namespaces served")
	}
	err := c.notServed("team-a")
	for _, s := range []string{"capstan, capstan-system, platform", "not namespace team-a", "set spec.source.git.url", "--root-source-namespaces"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the error does not say %q: %v", s, err)
		}
	}
}

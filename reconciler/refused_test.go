package reconciler

import (
	"errors"
	"strings"
	"testing"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/sources/git"
)

// A revision whose content the source refused is not downloaded again at
// every poll: the answer cannot change until a new revision (or a refetch
// asked for by a person). A refused artifact is often a large one.
func TestRefusedRevisionIsNotFetchedAgain(t *testing.T) {
	srv, err := gitserver.New("", gitserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	url, err := srv.CreateRepo("big")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Commit("big", gitserver.DefaultBranch, map[string]string{"big.yaml": strings.Repeat("x", 4096)}, "a file over the limit"); err != nil {
		t.Fatal(err)
	}
	cache := newTestSourceCache(t, ArtifactOptions{MaxFileBytes: 1024})
	src, err := git.New(git.Options{URL: url, Branch: gitserver.DefaultBranch})
	if err != nil {
		t.Fatal(err)
	}
	cache.set("big", src)
	e, _ := cache.lookup("big")
	ctx := t.Context()
	rev, err := e.revision(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, fetched, first := e.fetch(ctx, rev)
	if !fetched || !errors.Is(first, sources.ErrRefused) {
		t.Fatalf("fetch = fetched %v, %v; want the artifact refused", fetched, first)
	}
	requests := srv.Requests()
	_, fetched, again := e.fetch(ctx, rev)
	if fetched || again == nil || again.Error() != first.Error() {
		t.Errorf("fetch again = fetched %v, %v; want the same refusal without asking the server", fetched, again)
	}
	if got := srv.Requests(); got != requests {
		t.Errorf("the server was asked %d more times for a refused revision", got-requests)
	}
	r := &Reconciler{}
	r.refetch(&attempt{cd: &capstanv1.ClusterDeployment{}, source: e})
	if _, fetched, _ := e.fetch(ctx, rev); !fetched {
		t.Error("after a refetch the revision was not fetched again")
	}
}

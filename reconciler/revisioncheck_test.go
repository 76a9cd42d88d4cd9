package reconciler

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/sources/git"
)

// Deployments reading one repository share the remote's answer about its
// revision within the age they accept: a fleet asks the remote a few times
// per interval, not once per deployment. A push (expire) makes the next
// check ask, and so does an age of zero.
func TestDeploymentsOnOneRepositoryShareRevisionChecks(t *testing.T) {
	srv, err := gitserver.New("", gitserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	url, err := srv.CreateRepo("fleet")
	if err != nil {
		t.Fatal(err)
	}
	first, err := srv.Commit("fleet", gitserver.DefaultBranch, map[string]string{"a.yaml": "a: 1\n"}, "one")
	if err != nil {
		t.Fatal(err)
	}
	c := newTestSourceCache(t, ArtifactOptions{})
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	newSource := func() (sources.Source, error) { return git.New(git.Options{URL: url}) }
	lsRemote := func() int64 { return srv.RequestsTo("/fleet.git/info/refs") }
	check := func(user types.NamespacedName, maxAge time.Duration, wantCommit string, wantRequests int64) {
		t.Helper()
		e, err := c.get("git|"+url, user, newSource)
		if err != nil {
			t.Fatal(err)
		}
		rev, err := e.revision(context.Background(), maxAge)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(rev, wantCommit) {
			t.Errorf("%s: revision %s, want commit %s", user.Name, rev, wantCommit)
		}
		if n := lsRemote(); n != wantRequests {
			t.Errorf("%s: %d requests to the remote so far, want %d", user.Name, n, wantRequests)
		}
	}

	check(a, time.Minute, first, 1)
	check(b, time.Minute, first, 1) // a's answer, a moment old
	second, err := srv.Commit("fleet", gitserver.DefaultBranch, map[string]string{"a.yaml": "a: 2\n"}, "two")
	if err != nil {
		t.Fatal(err)
	}
	check(b, time.Minute, first, 1) // within the age b accepts: not seen yet
	c.expireFor(a)                  // a push
	check(b, time.Minute, second, 2)
	check(a, time.Minute, second, 2)
	check(a, 0, second, 3)
}

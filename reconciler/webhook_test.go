package reconciler

import (
	"context"
	"slices"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// following is a deployment that reads branch of url; url "" reads the
// root source.
func following(name, url, branch string) *capstanv1.ClusterDeployment {
	cd := dependent(name)
	cd.Spec.Source = nil
	if url != "" {
		cd.Spec.Source = &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url, Ref: capstanv1.GitRef{Branch: branch}}}
	}
	return cd
}

// pushFixture is a trigger over a fake client holding four deployments:
// two branches of infra.git (main by default), another repository, and
// one on the root source.
func pushFixture(t *testing.T, elected <-chan struct{}) (*pushTrigger, chan event.GenericEvent) {
	t.Helper()
	objs := []client.Object{
		following("main", "https://git.example/platform/infra.git", ""),
		following("release", "https://git.example/platform/infra.git", "release-1"),
		following("apps", "https://git.example/platform/apps.git", "main"),
		following("rooted", "", ""),
	}
	ch := make(chan event.GenericEvent, len(objs))
	return &pushTrigger{client: fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(objs...).Build(), enqueue: ch, elected: elected}, ch
}

// drained returns the names of the deployments queued so far.
func drained(ch chan event.GenericEvent) []string {
	var out []string
	for {
		select {
		case e := <-ch:
			out = append(out, e.Object.GetName())
		default:
			slices.Sort(out)
			return out
		}
	}
}

// A push reconciles exactly the deployments that follow the pushed
// repository and branch (a push that names no branch: every branch),
// whatever form of the repository's URL the forge sends; a deployment on
// the root source is not queued when no root is served.
func TestPushTriggersTheDeploymentsThatFollowIt(t *testing.T) {
	p, ch := pushFixture(t, nil)
	ctx := context.Background()
	cases := []struct {
		urls   []string
		branch string
		want   []string
	}{
		{[]string{"https://git.example/platform/infra.git"}, "main", []string{"main"}},
		{[]string{"https://git.example/platform/infra"}, "release-1", []string{"release"}},
		{[]string{"https://git.example/platform/infra.git"}, "", []string{"main", "release"}},
		{[]string{"https://git.example/platform/infra.git"}, "feature", nil},
		{[]string{"https://git.example/platform/other.git"}, "main", nil},
		{[]string{"ssh://git@git.example/platform/other.git", "https://git.example/platform/apps.git"}, "main", []string{"apps"}},
	}
	for _, tc := range cases {
		u, matched := p.Match(tc.urls, tc.branch)
		if matched != (len(tc.want) > 0) {
			t.Errorf("Match(%v, %q) = %v, want %v", tc.urls, tc.branch, matched, len(tc.want) > 0)
			continue
		}
		if !matched {
			continue
		}
		p.Trigger(ctx, u, tc.branch)
		if got := drained(ch); !slices.Equal(got, tc.want) {
			t.Errorf("push of %v %q queued %v, want %v", tc.urls, tc.branch, got, tc.want)
		}
	}
}

// A standby replica that does not shard ignores pushes: nothing would
// drain its queue, and the leader's poll picks the push up.
func TestPushToAStandbyQueuesNothing(t *testing.T) {
	elected := make(chan struct{})
	p, ch := pushFixture(t, elected)
	p.Trigger(context.Background(), "https://git.example/platform/infra.git", "main")
	if got := drained(ch); len(got) != 0 {
		t.Errorf("a standby queued %v", got)
	}
	close(elected)
	p.Trigger(context.Background(), "https://git.example/platform/infra.git", "main")
	if got := drained(ch); !slices.Equal(got, []string{"main"}) {
		t.Errorf("the leader queued %v, want [main]", got)
	}
}

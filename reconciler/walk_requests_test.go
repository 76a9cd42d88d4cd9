package reconciler

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// requestLog records the method and path of every request a rest.Config
// sends.
type requestLog struct {
	mu   sync.Mutex
	seen []string
}

func (l *requestLog) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			key := req.Method + " " + req.URL.Path
			if req.URL.Query().Has("dryRun") {
				key = "DRYRUN " + req.URL.Path
			}
			l.mu.Lock()
			l.seen = append(l.seen, key)
			l.mu.Unlock()
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

// count returns how many requests had method ("DRYRUN" for a dry run)
// and a path containing contains.
func (l *requestLog) count(method, contains string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.seen {
		if strings.HasPrefix(s, method+" ") && strings.Contains(s, contains) {
			n++
		}
	}
	return n
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A new deployment whose one stage is Ready as soon as it is applied costs
// the API server, besides a dry run and an apply per object: two status
// writes (the walk's start, with the preflight's verdict; Ready), one
// event (Ready, which tells the stage), and no read of the objects it is
// about to create: the preflight found them absent. (Before: four status
// writes, three events and a GET per object in a namespace where a LIST
// page held other objects.)
func TestANewDeploymentWritesStatusTwiceAndOneEvent(t *testing.T) {
	env := controlPlane(t)
	ctx := t.Context()
	if err := testenv.InstallCRDs(ctx, env.Config, "../manifests/crds/capstan.dev_clusterdeployments.yaml"); err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, "walk-requests")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gitserver.New("", gitserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	url, err := srv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	const objects = 12
	var b strings.Builder
	for i := range objects {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm-%02d}\ndata: {v: \"%d\"}\n", i, i)
	}
	if _, err := srv.Commit(ns, gitserver.DefaultBranch, map[string]string{
		"app/kustomization.yaml": "namespace: " + ns + "\nresources: [cms.yaml]\n",
		"app/cms.yaml":           b.String(),
	}, "twelve ConfigMaps"); err != nil {
		t.Fatal(err)
	}

	log := &requestLog{}
	opts := DefaultOptions()
	opts.Config = log.wrap(env.Config)
	opts.MetricsAddr, opts.HealthAddr = "0", "0"
	opts.MetricsRegistry = prometheus.NewRegistry()
	opts.LeaderElection.Enabled = false
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(dctx) }()
	t.Cleanup(func() { cancel(); <-done })

	c, err := client.New(env.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app"},
		Spec: capstanv1.ClusterDeploymentSpec{Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url}}, Path: "app"}}
	if err := c.Create(ctx, cd); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !conditionTrue(cd, capstanv1.ConditionReady) || cd.Status.Revision == "" {
		if time.Now().After(deadline) {
			t.Fatalf("not Ready within a minute: %+v", cd.Status.Conditions)
		}
		time.Sleep(100 * time.Millisecond)
		if err := c.Get(ctx, client.ObjectKeyFromObject(cd), cd); err != nil {
			t.Fatal(err)
		}
	}

	base := "/namespaces/" + ns + "/"
	if got := log.count("PATCH", base+"clusterdeployments/app/status"); got != 2 {
		t.Errorf("%d status writes, want 2: the walk's start and Ready", got)
	}
	if got := log.count("POST", base+"events"); got != 1 {
		t.Errorf("%d events, want 1: Ready", got)
	}
	if got := log.count("GET", base+"configmaps"); got != 0 {
		t.Errorf("%d reads of ConfigMaps, want 0: the preflight found them absent", got)
	}
	if got, want := log.count("DRYRUN", base+"configmaps/"), objects; got != want {
		t.Errorf("%d dry runs, want %d", got, want)
	}
	if got, want := log.count("PATCH", base+"configmaps/"), objects; got != want {
		t.Errorf("%d applies, want %d", got, want)
	}
}

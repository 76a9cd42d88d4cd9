package e2e

import (
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/sources"
)

// outage stands in front of the git server at an address of its own,
// forwarding connections until it is taken down: the git server, as the
// deployment reaches it, goes away and comes back at the same URL.
type outage struct {
	t        testing.TB
	addr     string
	upstream string

	mu    sync.Mutex
	l     net.Listener
	conns []net.Conn
}

func newOutage(t testing.TB, upstream string) *outage {
	t.Helper()
	o := &outage{t: t, upstream: upstream}
	o.up("127.0.0.1:0")
	t.Cleanup(o.down)
	return o
}

// url is rawURL (of the git server) as reached through o.
func (o *outage) url(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		o.t.Fatal(err)
	}
	u.Host = o.addr
	return u.String()
}

// up serves addr again (after down, the same address).
func (o *outage) up(addr string) {
	o.t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		o.t.Fatal(err)
	}
	o.mu.Lock()
	o.l, o.addr = l, l.Addr().String()
	o.mu.Unlock()
	go o.serve(l)
}

// down refuses every new connection and cuts those open.
func (o *outage) down() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.l != nil {
		_ = o.l.Close()
		o.l = nil
	}
	for _, c := range o.conns {
		_ = c.Close()
	}
	o.conns = nil
}

func (o *outage) serve(l net.Listener) {
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", o.upstream)
		if err != nil {
			_ = in.Close()
			continue
		}
		o.mu.Lock()
		o.conns = append(o.conns, in, out)
		o.mu.Unlock()
		go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
		go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
	}
}

// A git outage is not a failure of what was applied: Ready stays True,
// SourceReady=False says why, and once the server is back SourceReady is
// True again at the next poll. The daemon's backoff is set to an hour, so
// only the poll interval, which caps the backoff of source errors, can
// bring the recovery within the test's deadline.
func TestSourceOutageKeepsReadyAndRecoversAtTheInterval(t *testing.T) {
	c := newClient(t)
	startDaemonWith(t, nil, func(o *reconciler.Options) {
		o.Reconciler.RetryBase, o.Reconciler.RetryMax = time.Hour, time.Hour
	})
	ns := newNamespace(t)
	repo, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("1"), "good"); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(repo)
	if err != nil {
		t.Fatal(err)
	}
	git := newOutage(t, u.Host)
	createDeployment(t, c, ns, "two", twoStageSpec(git.url(repo), ns, gitSecret(t, c, ns)))
	waitFor(t, "Widget infra", func() (bool, error) { return object(t, c, widgetGVK, ns, "infra") != nil, nil })
	setWidgetReady(t, c, ns, "infra")
	ready := waitDeployment(t, c, ns, "two", "Ready", isReady)

	addr := git.addr
	git.down()
	cd := waitDeployment(t, c, ns, "two", "SourceReady=False while git is down", func(cd *capstanv1.ClusterDeployment) bool {
		if !isReady(cd) {
			t.Fatalf("Ready turned False during the git outage: %s", describe(cd))
		}
		s := condition(cd, capstanv1.ConditionSourceReady)
		return s != nil && s.Status == metav1.ConditionFalse
	})
	s := condition(cd, capstanv1.ConditionSourceReady)
	if s.Reason != sources.ReasonSourceUnavailable || !strings.Contains(s.Message, git.addr) {
		t.Errorf("SourceReady = %s: %q; want reason %s and a message naming the server", s.Reason, s.Message, sources.ReasonSourceUnavailable)
	}
	if st := condition(cd, capstanv1.ConditionStalled); st != nil && st.Status == metav1.ConditionTrue {
		t.Errorf("Stalled during an outage: %s", describe(cd))
	}
	if cd.Status.Revision != ready.Status.Revision {
		t.Errorf("revision %s during the outage, want the applied %s", cd.Status.Revision, ready.Status.Revision)
	}

	git.up(addr)
	waitDeployment(t, c, ns, "two", "SourceReady=True once git is back", func(cd *capstanv1.ClusterDeployment) bool {
		if !isReady(cd) {
			t.Fatalf("Ready turned False after the git outage: %s", describe(cd))
		}
		s := condition(cd, capstanv1.ConditionSourceReady)
		return s != nil && s.Status == metav1.ConditionTrue
	})
}

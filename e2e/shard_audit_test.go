package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/capstan-dev/capstan/reconciler"
)

// shardWrite is one write a replica made for a deployment that the API
// server accepted (2xx): a patch of its ConfigMap (dry-runs not counted),
// a write of the ClusterDeployment or its status, of its claim Lease.
type shardWrite struct {
	replica, deployment, what string
	start, end                time.Time
}

// shardAudit records, per replica, every accepted write for the
// deployments of one namespace, with when it was sent and when it was
// answered. It can also cut a replica off the API server, as if its
// process had died: every request it makes fails, nothing is released.
// The managed fields cannot tell replicas apart (they share a field
// manager); this is the ground truth the test judges ownership by.
type shardAudit struct {
	ns string

	mu     sync.Mutex
	writes []shardWrite
	cut    map[string]bool
}

var claimName = regexp.MustCompile(`capstan-claim\.(d-[0-9]+)`)

// wrap returns cfg with replica's requests audited.
func (a *shardAudit) wrap(replica string, cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			a.mu.Lock()
			dead := a.cut[replica]
			a.mu.Unlock()
			if dead {
				return nil, fmt.Errorf("replica %s is cut off (the test killed it)", replica)
			}
			if req.Method == http.MethodGet || req.URL.Query().Has("dryRun") {
				return rt.RoundTrip(req)
			}
			deployment, what := a.deploymentOf(req)
			start := time.Now()
			resp, err := rt.RoundTrip(req)
			if deployment != "" && err == nil && resp.StatusCode/100 == 2 {
				a.mu.Lock()
				a.writes = append(a.writes, shardWrite{replica: replica, deployment: deployment, what: what, start: start, end: time.Now()})
				a.mu.Unlock()
			}
			return resp, err
		})
	})
	return cfg
}

// deploymentOf names the deployment a write is for, "" for writes of
// nothing deployment-specific (events, membership Leases).
func (a *shardAudit) deploymentOf(req *http.Request) (string, string) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	i := slices.Index(parts, "namespaces")
	if i < 0 || i+2 >= len(parts) || parts[i+1] != a.ns {
		return "", ""
	}
	resource := parts[i+2]
	name := ""
	if i+3 < len(parts) {
		name = parts[i+3]
	}
	what := req.Method + " " + resource
	switch {
	case resource == "clusterdeployments":
		return name, what
	case resource == "configmaps" && strings.HasPrefix(name, "cm-"):
		return strings.TrimPrefix(name, "cm-"), what
	case resource == "leases" && name != "":
		if m := claimName.FindStringSubmatch(name); m != nil {
			return m[1], what
		}
	case resource == "leases" && req.Method == http.MethodPost && req.Body != nil:
		// A create names the Lease in its body.
		body, err := io.ReadAll(req.Body)
		req.Body.Close()
		req.Body = io.NopCloser(bytes.NewReader(body))
		if err == nil {
			if m := claimName.FindSubmatch(body); m != nil {
				return string(m[1]), what
			}
		}
	}
	return "", ""
}

func (a *shardAudit) kill(replica string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cut == nil {
		a.cut = map[string]bool{}
	}
	a.cut[replica] = true
}

func (a *shardAudit) revive(replica string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.cut, replica)
}

// byDeployment returns the writes per deployment, in the order they were
// sent.
func (a *shardAudit) byDeployment() map[string][]shardWrite {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string][]shardWrite{}
	for _, w := range a.writes {
		out[w.deployment] = append(out[w.deployment], w)
	}
	for _, ws := range out {
		sort.Slice(ws, func(i, j int) bool { return ws[i].start.Before(ws[j].start) })
	}
	return out
}

// writers returns who wrote for each deployment between from and to.
func (a *shardAudit) writers(from, to time.Time) map[string]map[string]int {
	out := map[string]map[string]int{}
	for d, ws := range a.byDeployment() {
		for _, w := range ws {
			if w.start.Before(from) || w.start.After(to) {
				continue
			}
			if out[d] == nil {
				out[d] = map[string]int{}
			}
			out[d][w.replica]++
		}
	}
	return out
}

// runs splits a deployment's writes into runs of one replica, checking
// that no two replicas' writes overlap: each run ends (its last write
// answered) before the next one's first write is sent. A release (the
// delete of the claim) is the handover itself: it takes effect before its
// answer arrives, and the next owner's claim, created only once it took
// effect, may be sent meanwhile; it counts as ended when sent.
func runs(ws []shardWrite) (replicas []string, overlap error) {
	var lastEnd time.Time
	for _, w := range ws {
		end := w.end
		if w.what == "DELETE leases" {
			end = w.start
		}
		if len(replicas) == 0 || replicas[len(replicas)-1] != w.replica {
			if len(replicas) > 0 && !lastEnd.Before(w.start) {
				overlap = fmt.Errorf("%s sent %s at %s while %s's write answered at %s was in flight",
					w.replica, w.what, w.start.Format("15:04:05.000000"), replicas[len(replicas)-1], lastEnd.Format("15:04:05.000000"))
			}
			replicas = append(replicas, w.replica)
			lastEnd = time.Time{}
		}
		if end.After(lastEnd) {
			lastEnd = end
		}
	}
	return replicas, overlap
}

// waitWithin is waitFor with its own deadline, for the waits on hundreds
// of deployments.
func waitWithin(t *testing.T, d time.Duration, what string, cond func() (bool, error)) time.Duration {
	t.Helper()
	begin := time.Now()
	var last error
	for time.Since(begin) < d {
		ok, err := cond()
		if ok {
			return time.Since(begin)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s (last: %v)", d, what, last)
	return 0
}

// viewMonitor records, for each daemon, every change of the live
// replicas it sees, so that the test knows whether membership stayed as
// the test set it (a replica starved of CPU for a lease duration is
// rightly taken for dead: its share moves, and moves back).
type viewMonitor struct {
	mu      sync.Mutex
	daemons map[string]*reconciler.Daemon
	views   map[string][]viewAt
}

type viewAt struct {
	at      time.Time
	members []string
}

func newViewMonitor(t *testing.T) *viewMonitor {
	m := &viewMonitor{daemons: map[string]*reconciler.Daemon{}, views: map[string][]viewAt{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			m.look()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return m
}

func (m *viewMonitor) set(id string, d *reconciler.Daemon) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.daemons[id] = d
}

func (m *viewMonitor) look() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, d := range m.daemons {
		got := d.ShardMembers()
		if v := m.views[id]; len(v) == 0 || !slices.Equal(v[len(v)-1].members, got) {
			m.views[id] = append(v, viewAt{at: time.Now(), members: got})
		}
	}
}

// changed reports the views of replicas ids that changed between from and
// to, other than to want; "" when none did.
func (m *viewMonitor) changed(from, to time.Time, want []string, ids ...string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	for _, id := range ids {
		for _, v := range m.views[id] {
			if v.at.After(from) && v.at.Before(to) && !slices.Equal(v.members, want) {
				fmt.Fprintf(&b, " %s saw %v at %s;", id, v.members, v.at.Format("15:04:05.000"))
			}
		}
	}
	return b.String()
}

// inParallel runs fn on names, eight at a time.
func inParallel(t *testing.T, names []string, fn func(name string) error) {
	t.Helper()
	var mu sync.Mutex
	var errs []error
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, name := range names {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(name); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d failed, e.g. %v", len(errs), len(names), errs[0])
	}
}

func listWrites(ws []shardWrite) string {
	var b strings.Builder
	for _, w := range ws {
		fmt.Fprintf(&b, "  %s %s %s +%s\n", w.start.Format("15:04:05.000"), w.replica, w.what, w.end.Sub(w.start).Round(time.Microsecond))
	}
	return b.String()
}

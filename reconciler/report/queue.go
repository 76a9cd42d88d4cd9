package report

import (
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// queue decides when the status of each deployment is committed. It is a
// pure function of the times it is given, so that coalescing is tested
// without a clock: a deployment's status is committed once it has waited
// settle since its first change, and never sooner than interval after the
// deployment's last commit; a failed commit is retried after a backoff.
// Deployments of one repository and branch (an address) that may be
// committed at that moment join the same commit. The caller locks.
type queue struct {
	settle              time.Duration
	retryBase, retryMax time.Duration
	entries             map[types.NamespacedName]*entry
	busy                map[string]bool // addresses a worker pushes to now
}

// entry is what the queue knows of one deployment.
type entry struct {
	key types.NamespacedName
	// pending is the latest status not yet committed (trimmed); nil when
	// the branch holds what was last notified.
	pending *capstanv1.ClusterDeployment
	// hash is the hash of pending's rendering (before scrubbing); written
	// the hash of the last rendering the branch is known to hold.
	hash, written string
	address       address
	since         time.Time // when pending first differed from written
	last          time.Time // time of the last commit that changed the file
	retryAt       time.Time
	failures      int
	busy          bool
	// rejected is the reason the address was refused at this generation,
	// so that the event says it once.
	rejected    string
	rejectedGen int64
}

func newQueue(settle, retryBase, retryMax time.Duration) *queue {
	return &queue{settle: settle, retryBase: retryBase, retryMax: retryMax,
		entries: map[types.NamespacedName]*entry{}, busy: map[string]bool{}}
}

// mark records a new status of a deployment. A status whose rendering the
// branch already holds, with nothing else pending, changes nothing.
func (q *queue) mark(cd *capstanv1.ClusterDeployment, hash string, addr address, now time.Time) {
	key := types.NamespacedName{Namespace: cd.Namespace, Name: cd.Name}
	e := q.entries[key]
	if e == nil {
		e = &entry{key: key}
		q.entries[key] = e
	}
	if e.address.key() != addr.key() {
		// Another repository or branch holds nothing of it yet.
		e.written, e.last, e.retryAt, e.failures = "", time.Time{}, time.Time{}, 0
	}
	e.address = addr
	if e.pending == nil && hash == e.written {
		return
	}
	if e.pending == nil {
		e.since = now
	}
	e.pending, e.hash = cd, hash
}

// drop forgets a deployment that no longer reports.
func (q *queue) drop(key types.NamespacedName) {
	if e := q.entries[key]; e != nil && !e.busy {
		delete(q.entries, key)
	}
}

// due is when e's pending status may be committed.
func (q *queue) due(e *entry) time.Time {
	t := e.since.Add(min(q.settle, e.address.interval))
	if !e.last.IsZero() {
		t = later(t, e.last.Add(e.address.interval))
	}
	return later(t, e.retryAt)
}

// open reports whether e may join a commit at now: its window since the
// last commit has passed, even if it has not settled yet.
func (q *queue) open(e *entry, now time.Time) bool {
	if e.pending == nil || e.busy || now.Before(e.retryAt) {
		return false
	}
	return e.last.IsZero() || !now.Before(e.last.Add(e.address.interval))
}

// next returns when the next commit is due; false when nothing waits, or
// what waits is being pushed.
func (q *queue) next() (time.Time, bool) {
	var first time.Time
	found := false
	for _, e := range q.entries {
		if e.pending == nil || e.busy || q.busy[e.address.key()] {
			continue
		}
		if d := q.due(e); !found || d.Before(first) {
			first, found = d, true
		}
	}
	return first, found
}

// batch is the deployments of one address committed together.
type batch struct {
	address address
	items   []item
}

// item is one deployment's status taken for a commit.
type item struct {
	cd   *capstanv1.ClusterDeployment
	hash string
}

// take returns the commits due at now: for every address that is not
// being pushed to and has a deployment due, all its deployments that may
// be committed. They are busy until finish.
func (q *queue) take(now time.Time) []batch {
	byAddr := map[string]*batch{}
	due := map[string]bool{}
	for _, e := range q.entries {
		k := e.address.key()
		if q.busy[k] || !q.open(e, now) {
			continue
		}
		if !now.Before(q.due(e)) {
			due[k] = true
		}
		b := byAddr[k]
		if b == nil {
			b = &batch{address: e.address}
			byAddr[k] = b
		}
		b.items = append(b.items, item{cd: e.pending, hash: e.hash})
	}
	var out []batch
	for k, b := range byAddr {
		if !due[k] {
			continue
		}
		q.busy[k] = true
		for _, it := range b.items {
			q.entries[keyOf(it.cd)].busy = true
		}
		slices.SortFunc(b.items, func(a, b item) int { return strings.Compare(keyOf(a.cd).String(), keyOf(b.cd).String()) })
		out = append(out, *b)
	}
	slices.SortFunc(out, func(a, b batch) int { return strings.Compare(a.address.key(), b.address.key()) })
	return out
}

func keyOf(cd *capstanv1.ClusterDeployment) types.NamespacedName {
	return types.NamespacedName{Namespace: cd.Namespace, Name: cd.Name}
}

// outcome is how the commit of one deployment's status ended.
type outcome int

const (
	// outcomeCommitted: a commit changed its file, at the given time.
	outcomeCommitted outcome = iota
	// outcomeUnchanged: the branch already held that content.
	outcomeUnchanged
	// outcomeFailed: retried after a backoff.
	outcomeFailed
	// outcomeRejected: the address cannot be used; nothing is retried
	// until the next status.
	outcomeRejected
)

// finish records how the commit of it ended at now (when, for a commit,
// is the commit's time). A status notified meanwhile stays pending.
func (q *queue) finish(it item, o outcome, when, now time.Time) {
	e := q.entries[keyOf(it.cd)]
	if e == nil {
		return
	}
	e.busy = false
	switch o {
	case outcomeCommitted:
		e.last, e.written, e.failures, e.retryAt = when, it.hash, 0, time.Time{}
	case outcomeUnchanged:
		e.written, e.failures, e.retryAt = it.hash, 0, time.Time{}
	case outcomeFailed:
		e.failures++
		e.retryAt = now.Add(q.backoff(e.failures))
		return
	case outcomeRejected:
	}
	if e.pending == it.cd {
		e.pending = nil
	} else if e.pending != nil && e.hash == e.written {
		e.pending = nil // it went back to what was just written
	} else if e.pending != nil {
		e.since = now
	}
}

// release ends the push to an address.
func (q *queue) release(addr address) { delete(q.busy, addr.key()) }

// pendingCount is how many deployments have a status waiting.
func (q *queue) pendingCount() int {
	n := 0
	for _, e := range q.entries {
		if e.pending != nil {
			n++
		}
	}
	return n
}

func (q *queue) backoff(failures int) time.Duration {
	d := q.retryBase
	for i := 1; i < failures && d < q.retryMax; i++ {
		d *= 2
	}
	return min(d, q.retryMax)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

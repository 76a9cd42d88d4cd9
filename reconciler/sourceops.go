package reconciler

import (
	"context"
	"errors"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/sources"
)

// Operations on a source run in goroutines of the source cache, not in
// the reconcile that asks for them (docs/deadlines.md). A reconcile that
// needs the remote's answer starts the operation, or joins the one under
// way, and returns at once without holding its worker; when the
// operation ends, every deployment waiting for it is woken (enqueued) and
// its next attempt takes the answer. Each operation runs under a
// deadline, spec.timeout of the deployment that started it: a source
// that answers a byte a second fails with a timeout naming it, and holds
// up nobody but the deployments reading it.
//
// One operation runs per source at a time (a Source is used by one
// goroutine at a time): deployments sharing a source share its checks and
// fetches. Sources that differ run their operations side by side, as
// many as there are: waiting on a socket costs a goroutine, and what an
// operation may hold is bounded by the artifact limits.

// opKind is what an operation asks the remote.
type opKind int

const (
	opCheck opKind = iota // the revision (git ls-remote, an OCI tag)
	opFetch               // the content
)

func (k opKind) String() string {
	if k == opFetch {
		return "fetch"
	}
	return "revision check"
}

// answerKey is the answer of one kind of operation for one deployment.
type answerKey struct {
	user types.NamespacedName
	kind opKind
}

// sourceAnswer is what an operation ended with.
type sourceAnswer struct {
	revision string            // a check's
	artifact *sources.Artifact // a fetch's
	// fetched is set for the one deployment whose attempt started the
	// fetch: the fetch counts once, however many waited for it.
	fetched bool
	// took is how long the remote took to answer; zero for an answer
	// from the cache or the store.
	took time.Duration
	err  error
}

// sourceOp is one operation under way.
type sourceOp struct {
	kind     opKind
	started  time.Time
	epoch    uint64
	limit    time.Duration
	revision string // a fetch's: the revision asked for, for the refusal memo
	starter  types.NamespacedName
	// waiters are the deployments to wake when it ends; true for those
	// whose question it answers (answers).
	waiters map[types.NamespacedName]bool
	done    chan struct{}
	answer  sourceAnswer // set before done is closed
}

// answers reports whether op answers a question of kind asked now by a
// deployment that accepts an answer maxAge old: a fetch under way
// answers any fetch; a check only one that accepts an answer asked for
// when it started, in the current epoch (no push since).
func (op *sourceOp) answers(kind opKind, maxAge time.Duration, epoch uint64, now time.Time) bool {
	if op.kind != kind {
		return false
	}
	return kind == opFetch || (op.epoch == epoch && now.Sub(op.started) <= maxAge)
}

// fresh returns the remote's last answer about the revision when it is
// less than maxAge old and no push came since.
func (e *sourceEntry) fresh(maxAge time.Duration, now time.Time) (string, bool) {
	if e.lastRevision != "" && e.lastEpoch == e.epoch.Load() && now.Sub(e.lastChecked) < maxAge {
		return e.lastRevision, true
	}
	return "", false
}

// takeAnswer returns and forgets the answer of the operation user waited
// for.
func (e *sourceEntry) takeAnswer(user types.NamespacedName, kind opKind) (sourceAnswer, bool) {
	k := answerKey{user: user, kind: kind}
	a, ok := e.answers[k]
	if ok {
		delete(e.answers, k)
	}
	return a, ok
}

// dropAnswers forgets what a deleted deployment was answered.
func (e *sourceEntry) dropAnswers(user types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.answers, answerKey{user: user, kind: opCheck})
	delete(e.answers, answerKey{user: user, kind: opFetch})
}

// revisionFor is the revision check of a reconcile of user, which never
// waits for the remote: the answer of the check user waited for, else
// the remote's last answer when it is less than maxAge old, else pending
// (a check starts, or is joined, under limit; user is woken when it
// ends). A thousand deployments on one repository then ask it about once
// per maxAge between them, not a thousand times per interval.
func (e *sourceEntry) revisionFor(user types.NamespacedName, maxAge, limit time.Duration) (ans sourceAnswer, pending bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if a, ok := e.takeAnswer(user, opCheck); ok {
		return a, false
	}
	now := time.Now()
	if rev, ok := e.fresh(maxAge, now); ok {
		return sourceAnswer{revision: rev}, false
	}
	e.await(opCheck, user, maxAge, limit, "", now)
	return sourceAnswer{}, true
}

// fetchFor is the fetch of a reconcile of user, which never waits for
// the remote: the answer of the fetch user waited for, else the
// artifact at revision when the store holds it, else the refusal of
// revision, else pending (a fetch starts, or is joined, under limit;
// user is woken when it ends). The answer's fetched tells whether user's
// attempt made the remote send content.
func (e *sourceEntry) fetchFor(user types.NamespacedName, revision string, limit time.Duration) (ans sourceAnswer, pending bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if a, ok := e.takeAnswer(user, opFetch); ok {
		return a, false
	}
	if art, ok := e.store.Get(e.key, revision); ok {
		return sourceAnswer{artifact: art}, false
	}
	if revision != "" && revision == e.refused {
		return sourceAnswer{err: e.refusal}, false
	}
	e.await(opFetch, user, 0, limit, revision, time.Now())
	return sourceAnswer{}, true
}

// await makes user wait for an operation of kind: the one under way,
// which answers user only if it answers its question (otherwise user is
// only woken, to ask again), or a new one. e.mu is held.
func (e *sourceEntry) await(kind opKind, user types.NamespacedName, maxAge, limit time.Duration, revision string, now time.Time) {
	if op := e.running; op != nil {
		op.waiters[user] = op.waiters[user] || op.answers(kind, maxAge, e.epoch.Load(), now)
		return
	}
	e.start(kind, user, limit, revision, now)
}

// start runs an operation of kind in a goroutine of its own. e.mu is held.
func (e *sourceEntry) start(kind opKind, user types.NamespacedName, limit time.Duration, revision string, now time.Time) *sourceOp {
	op := &sourceOp{
		kind: kind, started: now, epoch: e.epoch.Load(), limit: limit, revision: revision, starter: user,
		waiters: map[types.NamespacedName]bool{}, done: make(chan struct{}),
	}
	if user != (types.NamespacedName{}) {
		op.waiters[user] = true
	}
	e.running = op
	go e.run(op)
	return op
}

// run carries out op under its deadline and hands its answer to those
// waiting for it.
func (e *sourceEntry) run(op *sourceOp) {
	base := e.base
	if base == nil {
		base = context.Background()
	}
	ctx, cancel := context.WithTimeout(base, op.limit)
	var ans sourceAnswer
	if op.kind == opCheck {
		ans.revision, ans.err = e.source.Revision(ctx)
	} else {
		ans.artifact, ans.err = e.source.Fetch(ctx)
		ans.fetched = ans.err != nil || ans.artifact != nil
	}
	ans.took = time.Since(op.started)
	if ans.err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && base.Err() == nil {
		ans.err = sources.TimedOut(op.kind.String(), e.url, op.limit, ans.err)
	}
	cancel()
	e.checkAuth(ans.err) // not under e.mu: it takes the cache's lock

	e.mu.Lock()
	switch {
	case op.kind == opCheck && ans.err == nil:
		e.lastRevision, e.lastChecked, e.lastEpoch = ans.revision, op.started, op.epoch
	case op.kind == opCheck:
		e.lastRevision = ""
	case ans.err == nil:
		e.store.Put(e.key, ans.artifact)
	case errors.Is(ans.err, sources.ErrRefused) && op.revision != "":
		e.refused, e.refusal = op.revision, ans.err
	}
	e.running = nil
	op.answer = ans
	if e.answers == nil {
		e.answers = map[answerKey]sourceAnswer{}
	}
	for user, answered := range op.waiters {
		if answered {
			a := ans
			a.fetched = ans.fetched && user == op.starter
			e.answers[answerKey{user: user, kind: op.kind}] = a
		}
	}
	e.mu.Unlock()
	close(op.done)
	if e.wake != nil {
		for user := range op.waiters {
			e.wake(user)
		}
	}
}

// limitOf is the deadline of an operation a caller waits for itself:
// ctx's, within DefaultTimeout.
func limitOf(ctx context.Context) time.Duration {
	limit := capstanv1.DefaultTimeout
	if d, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(d))
	}
	return max(limit, time.Millisecond)
}

// revision returns the remote's revision as revisionFor does, for a
// caller that waits for it in its own goroutine (the root source): the
// answer less than maxAge old, or that of a check it starts or joins.
func (e *sourceEntry) revision(ctx context.Context, maxAge time.Duration) (string, error) {
	for {
		e.mu.Lock()
		now := time.Now()
		if rev, ok := e.fresh(maxAge, now); ok {
			e.mu.Unlock()
			return rev, nil
		}
		op, mine := e.running, true
		if op == nil {
			op = e.start(opCheck, types.NamespacedName{}, limitOf(ctx), "", now)
		} else {
			mine = op.answers(opCheck, maxAge, e.epoch.Load(), now)
		}
		e.mu.Unlock()
		select {
		case <-op.done:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		if mine {
			return op.answer.revision, op.answer.err
		}
	}
}

// fetch returns the artifact at revision as fetchFor does, for a caller
// that waits for it in its own goroutine: from the store when it holds
// it, or from a fetch it starts or joins. fetched tells whether the
// remote was asked for content.
func (e *sourceEntry) fetch(ctx context.Context, revision string) (art *sources.Artifact, fetched bool, err error) {
	for {
		e.mu.Lock()
		if art, ok := e.store.Get(e.key, revision); ok {
			e.mu.Unlock()
			return art, false, nil
		}
		if revision != "" && revision == e.refused {
			e.mu.Unlock()
			return nil, false, e.refusal
		}
		op, mine := e.running, true
		if op == nil {
			op = e.start(opFetch, types.NamespacedName{}, limitOf(ctx), revision, time.Now())
		} else {
			mine = op.kind == opFetch
		}
		e.mu.Unlock()
		select {
		case <-op.done:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		if mine {
			return op.answer.artifact, true, op.answer.err
		}
	}
}

// wakeInto makes the deployments whose source operation ended be
// enqueued through ch, the controller's channel of generic events. Call
// it before the first operation starts.
func (c *sourceCache) wakeInto(ch chan<- event.GenericEvent) {
	c.wake = func(user types.NamespacedName) {
		obj := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: user.Namespace, Name: user.Name}}
		select {
		case ch <- event.GenericEvent{Object: obj}:
		case <-c.ctx.Done():
		}
	}
}

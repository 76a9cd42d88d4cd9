package report

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// Reporter commits the status of deployments to their status branch. The
// reconciler hands it every status it writes (Notify, which never blocks
// on git); Start runs the commits. Its methods are safe for concurrent
// use, and Notify on a nil Reporter does nothing.
type Reporter struct {
	opts    Options
	client  client.Reader
	events  recorder.EventRecorder
	metrics *collector

	mu    sync.Mutex
	queue *queue
	// readers maps each deployment to the branch it reads, so that no
	// deployment's status goes to a branch another one reads.
	readers map[types.NamespacedName]readRef
	wake    chan struct{}
}

var (
	_ manager.Runnable               = (*Reporter)(nil)
	_ manager.LeaderElectionRunnable = (*Reporter)(nil)
)

// New returns a Reporter that reads Secrets through c and emits events
// through events (nil: none).
func New(opts Options, c client.Reader, events recorder.EventRecorder) (*Reporter, error) {
	opts = opts.withDefaults()
	if root := opts.Root; root != nil && root.StatusBranch != "" {
		if root.URL == "" {
			return nil, errors.New("status commits of the root source: the root source is not a git repository")
		}
		if root.StatusBranch == branchOr(root.Branch, "main") {
			return nil, fmt.Errorf("status commits of the root source: branch %q is the branch the root source reads; "+
				"a status commit would trigger a reconcile of itself: pick another (default %s)", root.StatusBranch, capstanv1.DefaultStatusBranch)
		}
	}
	m, err := collectorFor(opts.Registerer)
	if err != nil {
		return nil, err
	}
	return &Reporter{
		opts: opts, client: c, events: events, metrics: m,
		queue:   newQueue(opts.Settle, opts.RetryBase, opts.RetryMax),
		readers: map[types.NamespacedName]readRef{},
		wake:    make(chan struct{}, 1),
	}, nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: only the
// replica that reconciles commits.
func (r *Reporter) NeedLeaderElection() bool { return true }

// Notify takes a status the reconciler wrote. It renders the status file
// and queues it when it changed; it never waits for git.
func (r *Reporter) Notify(cd *capstanv1.ClusterDeployment) {
	if r == nil {
		return
	}
	key := types.NamespacedName{Namespace: cd.Namespace, Name: cd.Name}
	read, isGit := reads(cd, r.opts.Root)
	addr, ok := addressOf(cd, r.opts.Root, r.opts.Interval)
	if ok && cd.Annotations[pivot.MirrorAnnotation] != "" {
		// A mirror of a deployment that moved: the Capstan of the target
		// reports it.
		ok = false
	}
	var snap *capstanv1.ClusterDeployment
	var hash string
	if ok {
		snap = trim(cd)
		// The hash only tells a change: JSON is stable and much cheaper
		// than the YAML that is written.
		data, err := json.Marshal(NewFile(snap))
		if err != nil {
			return // a status that does not render is not committed
		}
		sum := sha256.Sum256(data)
		hash = hex.EncodeToString(sum[:])
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if isGit {
		r.readers[key] = read
	} else {
		delete(r.readers, key)
	}
	if !ok {
		r.queue.drop(key)
		return
	}
	r.queue.mark(snap, hash, addr, r.opts.Now())
	r.metrics.setPending(r.queue.pendingCount())
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// trim copies what the status file and the commit need of cd: names,
// the spec's sources, reports and Secret references, and the status
// without its inventory, which can be large.
func trim(cd *capstanv1.ClusterDeployment) *capstanv1.ClusterDeployment {
	out := &capstanv1.ClusterDeployment{
		TypeMeta: cd.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: cd.Name, Namespace: cd.Namespace, UID: cd.UID, Generation: cd.Generation,
			DeletionTimestamp: cd.DeletionTimestamp.DeepCopy(),
		},
	}
	out.Spec.Source = cd.Spec.Source.DeepCopy()
	out.Spec.Report = cd.Spec.Report.DeepCopy()
	out.Spec.KubeConfig = cd.Spec.KubeConfig.DeepCopy()
	for _, s := range cd.Spec.Stages {
		if s.KubeConfig != nil {
			out.Spec.Stages = append(out.Spec.Stages, capstanv1.StageSpec{Name: s.Name, KubeConfig: s.KubeConfig.DeepCopy()})
		}
	}
	st := cd.Status
	st.Inventory = nil
	st.DeepCopyInto(&out.Status)
	return out
}

// Start commits until ctx ends. The commits under way when it ends are
// cancelled.
func (r *Reporter) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("report")
	ctx = log.IntoContext(ctx, logger)
	if r.opts.Resume {
		r.resume(ctx)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, r.opts.Workers)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		now := r.opts.Now()
		batches := r.queue.take(now)
		next, waiting := r.queue.next()
		r.mu.Unlock()
		for i, b := range batches {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				r.abandon(batches[i:])
				return nil
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				r.commit(ctx, b)
			}()
		}
		wait := time.Hour
		if waiting {
			wait = max(next.Sub(now), time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		case <-timer.C:
		}
	}
}

// resume queues the status of every deployment, as if just written.
func (r *Reporter) resume(ctx context.Context) {
	list := &capstanv1.ClusterDeploymentList{}
	if err := r.client.List(ctx, list); err != nil {
		log.FromContext(ctx).Error(err, "list ClusterDeployments to commit their status; each is committed at its next change")
		return
	}
	for i := range list.Items {
		if cd := &list.Items[i]; cd.Status.Revision != "" {
			r.Notify(cd)
		}
	}
}

// abandon frees batches that were taken but never started.
func (r *Reporter) abandon(batches []batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range batches {
		for _, it := range b.items {
			if e := r.queue.entries[keyOf(it.cd)]; e != nil {
				e.busy = false
			}
		}
		r.queue.release(b.address)
	}
}

// commit writes the status files of one batch in one commit.
func (r *Reporter) commit(ctx context.Context, b batch) {
	logger := log.FromContext(ctx).WithValues("branch", b.address.branch)
	results := make(map[types.NamespacedName]outcome, len(b.items))
	var when time.Time
	defer func() {
		r.mu.Lock()
		now := r.opts.Now()
		for _, it := range b.items {
			r.queue.finish(it, results[keyOf(it.cd)], when, now)
		}
		r.queue.release(b.address)
		r.metrics.setPending(r.queue.pendingCount())
		r.mu.Unlock()
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}()

	// Refuse what cannot work before anything is read or pushed.
	var items []item
	for _, it := range b.items {
		if reason := r.rejection(it.cd, b.address); reason != "" {
			results[keyOf(it.cd)] = outcomeRejected
			r.reject(ctx, it.cd, reason)
			continue
		}
		items = append(items, it)
	}
	if len(items) == 0 {
		return
	}
	fail := func(err error) {
		for _, it := range items {
			results[keyOf(it.cd)] = outcomeFailed
			r.failed(it.cd, err)
		}
		r.metrics.count(resultFailed, 1)
		logger.Error(err, "status commit failed; retrying with backoff", "deployments", len(items))
	}

	ctx, cancel := context.WithTimeout(ctx, r.opts.PushTimeout)
	defer cancel()
	t, err := resolve(ctx, r.client, batch{address: b.address, items: items}, r.opts.Root)
	if err != nil {
		fail(err)
		return
	}
	files := map[string][]byte{}
	var summary []string
	for _, it := range items {
		f := NewFile(it.cd).Scrub(t.scrubber.clean)
		data, err := f.Marshal()
		if err != nil {
			fail(err)
			return
		}
		files[Path(it.cd.Namespace, it.cd.Name)] = t.scrubber.cleanFile(data)
		summary = append(summary, fmt.Sprintf("%s/%s: %s", it.cd.Namespace, it.cd.Name, describe(f)))
	}
	res, err := push(ctx, pushRequest{
		url: t.url, branch: t.branch, auth: t.auth, caFrom: t.caFrom, files: files, message: commitMessage(summary),
		name: r.opts.AuthorName, email: r.opts.AuthorEmail, retries: r.opts.PushRetries, now: r.opts.Now,
	})
	r.metrics.raced(res.raced)
	if err != nil {
		fail(errors.New(t.scrubber.clean(err.Error())))
		return
	}
	changed := map[string]bool{}
	for _, p := range res.changed {
		changed[p] = true
	}
	for _, it := range items {
		results[keyOf(it.cd)] = outcomeUnchanged
		if !res.commit.IsZero() && changed[Path(it.cd.Namespace, it.cd.Name)] {
			results[keyOf(it.cd)] = outcomeCommitted
		}
		r.recovered(it.cd)
	}
	if res.commit.IsZero() {
		r.metrics.count(resultUnchanged, 1)
		return
	}
	when = res.when
	r.metrics.count(resultCommitted, 1)
	logger.V(1).Info("status committed", "commit", res.commit.String(), "files", len(res.changed), "raced", res.raced)
}

// rejection says why cd's status cannot go to addr, or "".
func (r *Reporter) rejection(cd *capstanv1.ClusterDeployment, addr address) string {
	if addr.reject != "" {
		return addr.reject
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if root := r.opts.Root; root != nil && root.URL != "" && sameRepo(addr.url, root.URL) && addr.branch == branchOr(root.Branch, "main") {
		return fmt.Sprintf("status branch %q is the branch the root source reads: a status commit would trigger a reconcile; pick another (default %s)",
			addr.branch, capstanv1.DefaultStatusBranch)
	}
	keys := slices.SortedFunc(maps.Keys(r.readers), func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
	for _, key := range keys {
		if read := r.readers[key]; sameRepo(addr.url, read.url) && addr.branch == read.branch {
			return fmt.Sprintf("status branch %q is the branch ClusterDeployment %s reads: a status commit would trigger its reconcile; pick another (default %s)",
				addr.branch, key, capstanv1.DefaultStatusBranch)
		}
	}
	return ""
}

// reject tells once per generation why a deployment's status is not
// committed.
func (r *Reporter) reject(ctx context.Context, cd *capstanv1.ClusterDeployment, reason string) {
	r.metrics.count(resultRejected, 1)
	r.mu.Lock()
	e := r.queue.entries[keyOf(cd)]
	first := e != nil && (e.rejected != reason || e.rejectedGen != cd.Generation)
	if e != nil {
		e.rejected, e.rejectedGen = reason, cd.Generation
	}
	r.mu.Unlock()
	if !first {
		return
	}
	log.FromContext(ctx).Error(errors.New(reason), "status commits refused", "namespace", cd.Namespace, "name", cd.Name)
	r.event(cd, "Warning", "StatusCommitRejected", reason)
}

// failed tells of the first of a run of failed commits of cd's status.
func (r *Reporter) failed(cd *capstanv1.ClusterDeployment, err error) {
	r.mu.Lock()
	e := r.queue.entries[keyOf(cd)]
	first := e != nil && e.failures == 0
	r.mu.Unlock()
	if first {
		r.event(cd, "Warning", "StatusCommitFailed", "commit status to branch: "+err.Error()+" (retrying with backoff)")
	}
}

// recovered forgets a rejection once a commit works.
func (r *Reporter) recovered(cd *capstanv1.ClusterDeployment) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.queue.entries[keyOf(cd)]; e != nil {
		e.rejected, e.rejectedGen = "", 0
	}
}

func (r *Reporter) event(cd *capstanv1.ClusterDeployment, typ, reason, msg string) {
	if r.events == nil {
		return
	}
	const maxNote = 1024
	if len(msg) > maxNote {
		msg = msg[:maxNote-3] + "..."
	}
	r.events.Eventf(cd, nil, typ, reason, "Report", "%s", msg)
}

// describe says a status file in a few words, for commit messages.
func describe(f File) string {
	s := f.Phase
	if f.CurrentStage != "" && f.Phase != PhaseReady {
		s += " (stage " + f.CurrentStage + ")"
	}
	if f.Revision != "" {
		s += " at " + f.Revision
	}
	return s
}

func commitMessage(summary []string) string {
	if len(summary) == 1 {
		return "status: " + summary[0] + "\n"
	}
	return fmt.Sprintf("status: %d deployments\n\n%s\n", len(summary), strings.Join(summary, "\n"))
}

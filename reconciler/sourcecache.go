package reconciler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/sources"
)

// rootSourceKey is the cache key of the daemon's root source.
const rootSourceKey = "root"

// ArtifactOptions bound what artifacts and renders may take, so that the
// daemon's memory is bounded whatever its sources hold (docs/limits.md).
// Zero fields take the values of DefaultArtifactOptions.
type ArtifactOptions struct {
	// CacheDir is the directory below which artifacts are written, one
	// directory per daemon (`--artifact-cache-dir`).
	CacheDir string
	// CacheMaxBytes bounds the artifacts kept on disk; the least recently
	// used go first (`--artifact-cache-max-bytes`).
	CacheMaxBytes int64
	// MaxFileBytes bounds each file of an artifact and each file a render
	// reads (`--max-file-bytes`).
	MaxFileBytes int64
	// MaxArtifactBytes bounds the files of one artifact together, and an
	// OCI artifact's compressed layer (`--max-artifact-bytes`).
	MaxArtifactBytes int64
	// MaxDecompressedBytes bounds what an OCI layer or a git pack may
	// inflate to, stopping a compressed bomb while it streams
	// (`--max-decompressed-bytes`).
	MaxDecompressedBytes int64
	// MaxRenderBytes bounds what one render reads, the files its
	// kustomizations reach, each counted once (`--max-render-bytes`).
	MaxRenderBytes int64
	// MaxObjects bounds the objects one revision renders to
	// (`--max-objects`).
	MaxObjects int
	// MaxConcurrentRenders is how many renders run at once
	// (`--max-concurrent-renders`).
	MaxConcurrentRenders int
}

// DefaultArtifactOptions returns the bounds `capstan run` starts with.
func DefaultArtifactOptions() ArtifactOptions {
	return ArtifactOptions{
		CacheDir:             filepath.Join(os.TempDir(), "capstan-artifacts"),
		CacheMaxBytes:        512 << 20,
		MaxFileBytes:         render.DefaultMaxFileBytes,
		MaxArtifactBytes:     sources.DefaultMaxTotalBytes,
		MaxDecompressedBytes: sources.DefaultMaxDecompressedBytes,
		MaxRenderBytes:       render.DefaultMaxBytes,
		MaxObjects:           render.DefaultMaxObjects,
		MaxConcurrentRenders: 2,
	}
}

// withDefaults fills the zero fields.
func (o ArtifactOptions) withDefaults() ArtifactOptions {
	d := DefaultArtifactOptions()
	if o.CacheDir == "" {
		o.CacheDir = d.CacheDir
	}
	if o.CacheMaxBytes <= 0 {
		o.CacheMaxBytes = d.CacheMaxBytes
	}
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = d.MaxFileBytes
	}
	if o.MaxArtifactBytes <= 0 {
		o.MaxArtifactBytes = d.MaxArtifactBytes
	}
	if o.MaxDecompressedBytes <= 0 {
		o.MaxDecompressedBytes = d.MaxDecompressedBytes
	}
	if o.MaxRenderBytes <= 0 {
		o.MaxRenderBytes = d.MaxRenderBytes
	}
	if o.MaxObjects <= 0 {
		o.MaxObjects = d.MaxObjects
	}
	if o.MaxConcurrentRenders <= 0 {
		o.MaxConcurrentRenders = d.MaxConcurrentRenders
	}
	return o
}

// sourceLimits are the limits every source of the daemon fetches within.
func (o ArtifactOptions) sourceLimits() sources.Limits {
	return sources.Limits{
		MaxFileBytes:         o.MaxFileBytes,
		MaxTotalBytes:        o.MaxArtifactBytes,
		MaxDecompressedBytes: o.MaxDecompressedBytes,
	}.WithDefaults()
}

// artifactCacheUser is a source made outside the cache (the root source)
// that can be told to write its artifacts into the store, within the
// daemon's limits.
type artifactCacheUser interface {
	SetArtifactCache(dir string, limits sources.Limits)
}

// sourceEntry is one source shared by every deployment that reads from it.
// Its artifacts live in the cache's store, on disk, so that deployments
// sharing a repository fetch it once per revision while it stays there.
//
// Whatever asks the remote (a revision check, a fetch) runs in a goroutine
// of the entry's own, one at a time, under a deadline (sourceops.go): a
// reconcile that must wait for it returns and is woken when it ends, so
// that a slow source holds no reconcile worker (docs/deadlines.md).
type sourceEntry struct {
	mu     sync.Mutex
	key    string
	source sources.Source
	store  *sources.Store
	// url names the source in messages, without credentials.
	url string
	// onAuthError is called when the remote refuses the credentials, so
	// that the next attempt reads the Secret again.
	onAuthError func()
	// base is the context operations run under: the cache's, which ends
	// when the daemon stops. wake tells a deployment that an operation
	// it waits for ended.
	base context.Context
	wake func(types.NamespacedName)

	// The remote's last answer, when it was asked, and the epoch it was
	// asked in: see revisionFor. expire starts a new epoch.
	lastRevision string
	lastChecked  time.Time
	lastEpoch    uint64
	epoch        atomic.Uint64

	// running is the operation under way, nil when none is; answers
	// holds, per deployment, the outcome of the operation it waited for,
	// until its next attempt takes it.
	running *sourceOp
	answers map[answerKey]sourceAnswer

	// refused is the revision whose content the source refused (a file or
	// an artifact over a limit, a path that leaves the root, a signature
	// that does not verify), and refusal why: fetching it again cannot
	// change the answer, and a refused artifact may well be a large one.
	// A new revision, or a refetch (capstan reconcile --with-source),
	// asks the remote again.
	refused string
	refusal error
}

// expire makes the next revision check ask the remote: a push said the
// branch moved. A check already under way keeps its answer for those
// that asked before the push, not for those after it.
func (e *sourceEntry) expire() { e.epoch.Add(1) }

func (e *sourceEntry) checkAuth(err error) {
	if err != nil && errors.Is(err, sources.ErrAuth) && e.onAuthError != nil {
		e.onAuthError()
	}
}

// sourceCache holds the sources of all deployments, keyed by what
// identifies them (URL, branch, credentials version), the store their
// artifacts live in, and the daemon's bounds on artifacts and renders.
type sourceCache struct {
	mu      sync.Mutex
	entries map[string]*sourceEntry
	// users maps each deployment to the key of the source it reads, so
	// that a source, and its artifact, go when their last deployment does.
	users   map[types.NamespacedName]string
	secrets map[types.NamespacedName]cachedSecret
	now     func() time.Time

	opts    ArtifactOptions
	limits  sources.Limits
	store   *sources.Store
	renders chan struct{} // a slot per render running

	// ctx bounds the operations on sources (sourceops.go); close ends it.
	ctx    context.Context
	cancel context.CancelFunc
	// wake enqueues a deployment whose source operation ended; nil: none
	// (tests that wait themselves).
	wake func(types.NamespacedName)
	// rootNamespaces are the namespaces whose deployments without a
	// source of their own read the root source (rootServes).
	rootNamespaces map[string]bool
	// refetched remembers the reconcile request each deployment's
	// source was refetched for, so that the attempts that wait for the
	// fetch do not drop its artifact again.
	refetched map[types.NamespacedName]string
}

// secretTTL is how long a source's Secret is trusted before it is read
// again. Reading it on every poll would cost an API request per poll; a
// credential rotation is picked up within the TTL, or at once when the
// remote refuses the old credentials.
const secretTTL = 5 * time.Minute

type cachedSecret struct {
	secret *corev1.Secret
	read   time.Time
}

func newSourceCache(opts ArtifactOptions) (*sourceCache, error) {
	opts = opts.withDefaults()
	store, err := sources.OpenStore(opts.CacheDir, opts.CacheMaxBytes)
	if err != nil {
		return nil, fmt.Errorf("--artifact-cache-dir: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &sourceCache{
		entries:   map[string]*sourceEntry{},
		users:     map[types.NamespacedName]string{},
		secrets:   map[types.NamespacedName]cachedSecret{},
		now:       time.Now,
		opts:      opts,
		limits:    opts.sourceLimits(),
		store:     store,
		renders:   make(chan struct{}, opts.MaxConcurrentRenders),
		ctx:       ctx,
		cancel:    cancel,
		refetched: map[types.NamespacedName]string{},
	}, nil
}

// close ends the operations under way and removes every artifact from
// disk; the daemon has stopped.
func (c *sourceCache) close() error {
	c.cancel()
	return c.store.Close()
}

// newEntry returns the entry of a source, its operations bound to the
// cache's life. c.mu is held.
func (c *sourceCache) newEntry(key string, src sources.Source) *sourceEntry {
	url := key
	if named, ok := src.(interface{ URL() string }); ok {
		url = named.URL()
	}
	return &sourceEntry{key: key, source: src, store: c.store, url: redact(url), base: c.ctx, wake: c.wake}
}

// refetchOnce reports whether user's source is to be refetched for the
// reconcile request requested: only the first time it is asked.
func (c *sourceCache) refetchOnce(user types.NamespacedName, requested string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refetched[user] == requested {
		return false
	}
	c.refetched[user] = requested
	return true
}

// cachedSecret returns a Secret read less than secretTTL ago.
func (c *sourceCache) cachedSecret(key types.NamespacedName) (*corev1.Secret, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.secrets[key]
	if !ok || c.now().Sub(s.read) > secretTTL {
		return nil, false
	}
	return s.secret, true
}

func (c *sourceCache) keepSecret(s *corev1.Secret) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.secrets[client.ObjectKeyFromObject(s)] = cachedSecret{secret: s, read: c.now()}
}

// forgetSecrets makes every Secret be read again on its next use.
func (c *sourceCache) forgetSecrets() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.secrets)
}

// get returns the entry of key for the deployment user, creating it the
// first time.
func (c *sourceCache) get(key string, user types.NamespacedName, create func() (sources.Source, error)) (*sourceEntry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok {
		src, err := create()
		if err != nil {
			return nil, err
		}
		e = c.newEntry(key, src)
		e.onAuthError = c.forgetSecrets
		c.entries[key] = e
	}
	if old, had := c.users[user]; !had || old != key {
		// The deployment moved to another source (a new URL, rotated
		// credentials): the old one may have no reader left.
		c.users[user] = key
		if had {
			c.dropUnused(old)
		}
	}
	return e, nil
}

func (c *sourceCache) set(key string, src sources.Source) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u, ok := src.(artifactCacheUser); ok {
		u.SetArtifactCache(c.store.Dir(), c.limits)
	}
	c.entries[key] = c.newEntry(key, src)
}

// expireFor makes the next revision check of the source a deployment
// reads ask the remote (sourceEntry.expire); a deployment that has not
// named a source of its own reads the root.
func (c *sourceCache) expireFor(user types.NamespacedName) {
	if c == nil {
		return
	}
	c.mu.Lock()
	key, ok := c.users[user]
	if !ok {
		key = rootSourceKey
	}
	e := c.entries[key]
	c.mu.Unlock()
	if e != nil {
		e.expire()
	}
}

func (c *sourceCache) lookup(key string) (*sourceEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	return e, ok
}

// forget drops what a deleted deployment held: its share of its source,
// and the source with its artifact when no other deployment reads it.
func (c *sourceCache) forget(user types.NamespacedName) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.refetched, user)
	if root := c.entries[rootSourceKey]; root != nil {
		root.dropAnswers(user)
	}
	c.leaveLocked(user)
}

// leave drops a deployment's share of the source it named, which it no
// longer does (it reads the root now), and the source with its artifact
// when no other deployment reads it.
func (c *sourceCache) leave(user types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaveLocked(user)
}

func (c *sourceCache) leaveLocked(user types.NamespacedName) {
	key, ok := c.users[user]
	if !ok {
		return
	}
	if e := c.entries[key]; e != nil {
		e.dropAnswers(user)
	}
	delete(c.users, user)
	c.dropUnused(key)
}

// dropUnused drops the entry of key and its artifact if no deployment
// reads it; the root source stays.
func (c *sourceCache) dropUnused(key string) {
	if key == rootSourceKey {
		return
	}
	for _, k := range c.users {
		if k == key {
			return
		}
	}
	delete(c.entries, key)
	c.store.Drop(key)
}

// render builds the objects of a's artifact within the daemon's limits,
// no more than MaxConcurrentRenders at once (kustomize's memory grows
// with what it reads), within the deployment's spec.timeout. The
// artifact stays on disk while it is read: fetchArtifact pinned it.
// opts' limits are replaced by the daemon's.
func (r *Reconciler) render(ctx context.Context, a *attempt, opts render.Options) (*render.Result, error) {
	c := r.sources
	opts.MaxFileBytes, opts.MaxBytes, opts.MaxObjects = c.opts.MaxFileBytes, c.opts.MaxRenderBytes, c.opts.MaxObjects
	limit := a.cd.Spec.TimeoutOrDefault()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	select {
	case c.renders <- struct{}{}:
	case <-ctx.Done():
		return nil, renderCut(ctx, limit)
	}
	defer func() { <-c.renders }()
	res, err := render.BuildResult(ctx, a.artifact.FS, opts)
	if err != nil && ctx.Err() != nil {
		return nil, renderCut(ctx, limit)
	}
	return res, err
}

// renderCut is the error of a render that ctx ended: past spec.timeout
// (retried), or the attempt's own end.
func renderCut(ctx context.Context, limit time.Duration) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return failure.Retryable(render.ReasonRenderFailed,
			fmt.Errorf("did not finish within %s (spec.timeout), waiting for a render slot (--max-concurrent-renders) included: %w", limit, ctx.Err()))
	}
	return ctx.Err()
}

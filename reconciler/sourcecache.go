package reconciler

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/sources/git"
	"github.com/capstan-dev/capstan/stages"
)

// rootSourceKey is the cache key of the daemon's root source.
const rootSourceKey = "root"

// sourceEntry is one source shared by every deployment that reads from it,
// with the last artifact it produced, so that deployments sharing a
// repository fetch it once per revision.
type sourceEntry struct {
	mu       sync.Mutex
	source   sources.Source
	artifact *sources.Artifact
}

// revision asks the remote for its revision.
func (e *sourceEntry) revision(ctx context.Context) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.source.Revision(ctx)
}

// fetch returns the artifact at revision, from the cache when it holds it.
// fetched tells whether the remote was asked for content.
func (e *sourceEntry) fetch(ctx context.Context, revision string) (art *sources.Artifact, fetched bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.artifact != nil && e.artifact.Revision == revision {
		return e.artifact, false, nil
	}
	art, err = e.source.Fetch(ctx)
	if err != nil {
		return nil, true, err
	}
	e.artifact = art
	return art, true, nil
}

// sourceCache holds the sources of all deployments, keyed by what
// identifies them (URL, branch, credentials version).
type sourceCache struct {
	mu      sync.Mutex
	entries map[string]*sourceEntry
}

func newSourceCache() *sourceCache {
	return &sourceCache{entries: map[string]*sourceEntry{}}
}

func (c *sourceCache) get(key string, create func() (sources.Source, error)) (*sourceEntry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok {
		return e, nil
	}
	src, err := create()
	if err != nil {
		return nil, err
	}
	e := &sourceEntry{source: src}
	c.entries[key] = e
	return e, nil
}

func (c *sourceCache) set(key string, src sources.Source) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[key] = &sourceEntry{source: src}
}

func (c *sourceCache) lookup(key string) (*sourceEntry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	return e, ok
}

// sourceFor returns the source entry of a deployment: its own git source,
// or the root source when it names none.
func (r *Reconciler) sourceFor(ctx context.Context, cd *capstanv1.ClusterDeployment) (*sourceEntry, error) {
	spec := cd.Spec.Source
	if spec == nil || spec.Git == nil {
		e, ok := r.sources.lookup(rootSourceKey)
		if !ok {
			return nil, stages.Stalled(fmt.Errorf("spec.source: not set, and the daemon runs without a root source (--source); set spec.source.git.url"))
		}
		return e, nil
	}
	opts := git.Options{URL: spec.Git.URL, Branch: spec.Git.Ref.Branch}
	if opts.Branch == "" {
		opts.Branch = "main"
	}
	key := fmt.Sprintf("git|%s|%s", opts.URL, opts.Branch)
	if ref := spec.Git.SecretRef; ref != nil {
		secret := &corev1.Secret{}
		if err := r.client.Get(ctx, client.ObjectKey{Namespace: cd.Namespace, Name: ref.Name}, secret); err != nil {
			return nil, fmt.Errorf("spec.source.git.secretRef: read Secret %s/%s: %w", cd.Namespace, ref.Name, err)
		}
		opts.Auth = git.Auth{
			Username:      string(secret.Data["username"]),
			Password:      string(secret.Data["password"]),
			SSHPrivateKey: secret.Data["identity"],
			SSHKnownHosts: secret.Data["known_hosts"],
		}
		key += fmt.Sprintf("|%s/%s@%s", secret.Namespace, secret.Name, secret.ResourceVersion)
	}
	return r.sources.get(key, func() (sources.Source, error) {
		src, err := git.New(opts)
		if err != nil {
			return nil, stages.Stalled(fmt.Errorf("spec.source.git: %w", err))
		}
		return src, nil
	})
}

package reconciler

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/sources/git"
	"github.com/capstan-dev/capstan/sources/oci"
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
	// onAuthError is called when the remote refuses the credentials, so
	// that the next attempt reads the Secret again.
	onAuthError func()
}

// revision asks the remote for its revision.
func (e *sourceEntry) revision(ctx context.Context) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	rev, err := e.source.Revision(ctx)
	e.checkAuth(err)
	return rev, err
}

func (e *sourceEntry) checkAuth(err error) {
	if err != nil && errors.Is(err, sources.ErrAuth) && e.onAuthError != nil {
		e.onAuthError()
	}
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
		e.checkAuth(err)
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
	secrets map[types.NamespacedName]cachedSecret
	now     func() time.Time
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

func newSourceCache() *sourceCache {
	return &sourceCache{entries: map[string]*sourceEntry{}, secrets: map[types.NamespacedName]cachedSecret{}, now: time.Now}
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
	e := &sourceEntry{source: src, onAuthError: c.forgetSecrets}
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

// sourceFor returns the source entry of a deployment: its own git or OCI
// source, or the root source when it names none.
func (r *Reconciler) sourceFor(ctx context.Context, cd *capstanv1.ClusterDeployment) (*sourceEntry, error) {
	spec := cd.Spec.Source
	switch {
	case spec != nil && spec.Git != nil && spec.OCI != nil:
		return nil, stages.Stalled(fmt.Errorf("spec.source: set only one of git and oci"))
	case spec != nil && spec.Git != nil:
		return r.gitSourceFor(ctx, cd, spec.Git)
	case spec != nil && spec.OCI != nil:
		return r.ociSourceFor(ctx, cd, spec.OCI)
	}
	e, ok := r.sources.lookup(rootSourceKey)
	if !ok {
		return nil, stages.Stalled(fmt.Errorf("spec.source: not set, and the daemon runs without a root source (--source); set spec.source.git.url or spec.source.oci.url"))
	}
	return e, nil
}

// readSecret reads the Secret a source's secretRef names, from the
// deployment's namespace.
// It is read from the API at most once per secretTTL.
func (r *Reconciler) readSecret(ctx context.Context, cd *capstanv1.ClusterDeployment, field, name string) (*corev1.Secret, error) {
	key := client.ObjectKey{Namespace: cd.Namespace, Name: name}
	if s, ok := r.sources.cachedSecret(key); ok {
		return s, nil
	}
	secret := &corev1.Secret{}
	if err := r.client.Get(ctx, key, secret); err != nil {
		return nil, fmt.Errorf("%s: read Secret %s/%s: %w", field, cd.Namespace, name, err)
	}
	r.sources.keepSecret(secret)
	return secret, nil
}

func (r *Reconciler) gitSourceFor(ctx context.Context, cd *capstanv1.ClusterDeployment, spec *capstanv1.GitSource) (*sourceEntry, error) {
	opts := git.Options{URL: spec.URL, Branch: spec.Ref.Branch}
	if opts.Branch == "" {
		opts.Branch = "main"
	}
	key := fmt.Sprintf("git|%s|%s", opts.URL, opts.Branch)
	if ref := spec.SecretRef; ref != nil {
		secret, err := r.readSecret(ctx, cd, "spec.source.git.secretRef", ref.Name)
		if err != nil {
			return nil, err
		}
		opts.Auth = git.Auth{
			Username:      string(secret.Data["username"]),
			Password:      string(secret.Data["password"]),
			SSHPrivateKey: secret.Data["identity"],
			SSHKnownHosts: secret.Data["known_hosts"],
		}
		key += fmt.Sprintf("|%s/%s@%s", secret.Namespace, secret.Name, secret.ResourceVersion)
	}
	if v := spec.Verify; v != nil {
		secret, err := r.readSecret(ctx, cd, "spec.source.git.verify.secretRef", v.SecretRef.Name)
		if err != nil {
			return nil, err
		}
		opts.Verify = &git.Verify{}
		for _, k := range slices.Sorted(maps.Keys(secret.Data)) {
			switch {
			case strings.HasSuffix(k, ".asc"):
				opts.Verify.OpenPGPKeyRings = append(opts.Verify.OpenPGPKeyRings, string(secret.Data[k]))
			case strings.HasSuffix(k, ".pub"), k == "authorized_keys":
				opts.Verify.SSHKeys = append(opts.Verify.SSHKeys, secret.Data[k])
			}
		}
		if len(opts.Verify.OpenPGPKeyRings)+len(opts.Verify.SSHKeys) == 0 {
			return nil, stages.Stalled(fmt.Errorf("spec.source.git.verify.secretRef: Secret %s/%s has no key ending in .asc (OpenPGP) or .pub (SSH)",
				cd.Namespace, v.SecretRef.Name))
		}
		key += fmt.Sprintf("|verify=%s/%s@%s", secret.Namespace, secret.Name, secret.ResourceVersion)
	}
	return r.sources.get(key, func() (sources.Source, error) {
		src, err := git.New(opts)
		if err != nil {
			return nil, stages.Stalled(fmt.Errorf("spec.source.git: %w", err))
		}
		return src, nil
	})
}

// Keys of a Secret that may hold a docker config, in the order they are
// tried: the one of a kubernetes.io/dockerconfigjson Secret, then a file
// name people use with kubectl create secret generic --from-file.
var dockerConfigKeys = []string{corev1.DockerConfigJsonKey, "config.json"}

func (r *Reconciler) ociSourceFor(ctx context.Context, cd *capstanv1.ClusterDeployment, spec *capstanv1.OCISource) (*sourceEntry, error) {
	opts := oci.Options{
		URL:      spec.URL,
		Ref:      oci.Ref{Tag: spec.Ref.Tag, SemVer: spec.Ref.SemVer, Digest: spec.Ref.Digest},
		Insecure: spec.Insecure,
	}
	key := fmt.Sprintf("oci|%s|tag=%s|semver=%s|digest=%s|insecure=%t", opts.URL, opts.Ref.Tag, opts.Ref.SemVer, opts.Ref.Digest, opts.Insecure)
	if ref := spec.SecretRef; ref != nil {
		secret, err := r.readSecret(ctx, cd, "spec.source.oci.secretRef", ref.Name)
		if err != nil {
			return nil, err
		}
		for _, k := range dockerConfigKeys {
			if data := secret.Data[k]; len(data) > 0 {
				opts.Auth.DockerConfig = data
				break
			}
		}
		if opts.Auth.DockerConfig == nil {
			return nil, stages.Stalled(fmt.Errorf("spec.source.oci.secretRef: Secret %s/%s has no %s key: create it with kubectl create secret docker-registry",
				cd.Namespace, ref.Name, strings.Join(dockerConfigKeys, " or ")))
		}
		key += fmt.Sprintf("|%s/%s@%s", secret.Namespace, secret.Name, secret.ResourceVersion)
	}
	if v := spec.Verify; v != nil {
		secret, err := r.readSecret(ctx, cd, "spec.source.oci.verify.secretRef", v.SecretRef.Name)
		if err != nil {
			return nil, err
		}
		opts.Verify = &oci.Verify{}
		for _, k := range slices.Sorted(maps.Keys(secret.Data)) {
			if strings.HasSuffix(k, ".pub") {
				opts.Verify.PublicKeys = append(opts.Verify.PublicKeys, secret.Data[k])
			}
		}
		if len(opts.Verify.PublicKeys) == 0 {
			return nil, stages.Stalled(fmt.Errorf("spec.source.oci.verify.secretRef: Secret %s/%s has no key ending in .pub: create it with kubectl create secret generic %s --from-file=cosign.pub",
				cd.Namespace, v.SecretRef.Name, v.SecretRef.Name))
		}
		key += fmt.Sprintf("|verify=%s/%s@%s", secret.Namespace, secret.Name, secret.ResourceVersion)
	}
	return r.sources.get(key, func() (sources.Source, error) {
		src, err := oci.New(opts)
		if err != nil {
			return nil, stages.Stalled(fmt.Errorf("spec.source.oci: %w", err))
		}
		return src, nil
	})
}

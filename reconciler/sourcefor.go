package reconciler

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/sources/git"
	"github.com/capstan-dev/capstan/sources/oci"
)

// sourceFor returns the source entry of a deployment: its own git or OCI
// source, or the root source when it names none and its namespace is one
// the root source serves (rootNamespacesOf).
func (r *Reconciler) sourceFor(ctx context.Context, cd *capstanv1.ClusterDeployment) (*sourceEntry, error) {
	spec := cd.Spec.Source
	switch {
	case spec != nil && spec.Git != nil && spec.OCI != nil:
		return nil, failure.Stalled(sources.ReasonSourceInvalid, fmt.Errorf("spec.source: set only one of git and oci"))
	case spec != nil && spec.Git != nil:
		return r.gitSourceFor(ctx, cd, spec.Git)
	case spec != nil && spec.OCI != nil:
		return r.ociSourceFor(ctx, cd, spec.OCI)
	}
	// A deployment that named a source of its own and no longer does
	// gives up its share of it.
	r.sources.leave(client.ObjectKeyFromObject(cd))
	e, ok := r.sources.lookup(rootSourceKey)
	if !ok {
		return nil, failure.Stalled(sources.ReasonSourceInvalid, fmt.Errorf("spec.source: not set, and the daemon runs without a root source (--source); set spec.source.git.url or spec.source.oci.url"))
	}
	if !r.sources.rootServes(cd.Namespace) {
		return nil, r.sources.notServed(cd.Namespace)
	}
	return e, nil
}

func (r *Reconciler) gitSourceFor(ctx context.Context, cd *capstanv1.ClusterDeployment, spec *capstanv1.GitSource) (*sourceEntry, error) {
	gr := spec.Ref
	opts := git.Options{URL: spec.URL, Ref: git.Ref{Branch: gr.Branch, Tag: gr.Tag, SemVer: gr.SemVer, Commit: gr.Commit, Name: gr.Name}}
	if gr == (capstanv1.GitRef{}) {
		opts.Ref.Branch = git.DefaultBranch
	}
	key := fmt.Sprintf("git|%s|branch=%s|tag=%s|semver=%s|commit=%s|name=%s", opts.URL, opts.Ref.Branch, gr.Tag, gr.SemVer, gr.Commit, gr.Name)
	if ref := spec.SecretRef; ref != nil {
		secret, err := r.readSecret(ctx, cd, "spec.source.git.secretRef", ref.Name)
		if err != nil {
			return nil, err
		}
		if opts.Auth, err = git.AuthFromSecret(secret.Data); err != nil {
			return nil, failure.Stalled(sources.ReasonSourceInvalid, fmt.Errorf("spec.source.git.secretRef: Secret %s/%s: %w", cd.Namespace, ref.Name, err))
		}
		opts.CredentialsFrom.CA = sources.CAKeyOf("spec.source.git.secretRef", cd.Namespace+"/"+ref.Name)
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
			return nil, failure.Stalled(sources.ReasonSourceInvalid, fmt.Errorf("spec.source.git.verify.secretRef: Secret %s/%s has no key ending in .asc (OpenPGP) or .pub (SSH)",
				cd.Namespace, v.SecretRef.Name))
		}
		key += fmt.Sprintf("|verify=%s/%s@%s", secret.Namespace, secret.Name, secret.ResourceVersion)
	}
	opts.Limits, opts.CacheDir = r.sources.limits, r.sources.store.Dir()
	return r.sources.get(key, client.ObjectKeyFromObject(cd), func() (sources.Source, error) {
		src, err := git.New(opts)
		if err != nil {
			return nil, failure.Stalled(sources.ReasonSourceInvalid, fmt.Errorf("spec.source.git: %w", err))
		}
		return src, nil
	})
}

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
		if opts.Auth, err = ociAuthFromSecret(secret); err != nil {
			return nil, failure.Stalled(sources.ReasonSourceInvalid, fmt.Errorf("spec.source.oci.secretRef: Secret %s/%s: %w", cd.Namespace, ref.Name, err))
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
			return nil, failure.Stalled(sources.ReasonSourceInvalid, fmt.Errorf("spec.source.oci.verify.secretRef: Secret %s/%s has no key ending in .pub: create it with kubectl create secret generic %s --from-file=cosign.pub",
				cd.Namespace, v.SecretRef.Name, v.SecretRef.Name))
		}
		key += fmt.Sprintf("|verify=%s/%s@%s", secret.Namespace, secret.Name, secret.ResourceVersion)
	}
	opts.Limits, opts.CacheDir = r.sources.limits, r.sources.store.Dir()
	opts.MaxDownloadBytes = r.sources.opts.MaxArtifactBytes
	return r.sources.get(key, client.ObjectKeyFromObject(cd), func() (sources.Source, error) {
		src, err := oci.New(opts)
		if err != nil {
			return nil, failure.Stalled(sources.ReasonSourceInvalid, fmt.Errorf("spec.source.oci: %w", err))
		}
		return src, nil
	})
}

// fetchArtifact takes the content at the attempt's revision: from the
// store, or from the fetch the deployment waited for; otherwise the
// attempt ends waiting for a fetch (waitForSource). The artifact is
// pinned until the attempt ends.
func (r *Reconciler) fetchArtifact(ctx context.Context, a *attempt) (bool, error) {
	key, limit := client.ObjectKeyFromObject(a.cd), a.cd.Spec.TimeoutOrDefault()
	ans, pending := a.source.fetchFor(key, a.revision, limit)
	if pending {
		return r.waitForSource(a)
	}
	if ans.fetched {
		o := metrics.SourceObservation{Operation: metrics.SourceFetch, Duration: ans.took, Interval: interval(a.cd), Err: ans.err}
		if ans.err == nil {
			o.Revision = ans.artifact.Revision
		}
		r.metrics.ObserveSource(a.cd, o)
		r.fetches.Add(1)
	}
	if ans.err != nil {
		a.sourceFailed = true
		return false, fmt.Errorf("fetch %s: %w", a.revision, sources.Unavailable(ans.err))
	}
	// The artifact stays on disk until the attempt is done with it.
	art := ans.artifact
	release, ok := r.sources.store.Pin(art)
	if !ok {
		// Evicted, or replaced by a newer fetch, since it was fetched:
		// fetch what the store lacks.
		if ans, pending = a.source.fetchFor(key, a.revision, limit); pending {
			return r.waitForSource(a)
		}
		if ans.err != nil {
			a.sourceFailed = true
			return false, fmt.Errorf("fetch %s: %w", a.revision, sources.Unavailable(ans.err))
		}
		art = ans.artifact
		if release, ok = r.sources.store.Pin(art); !ok {
			return false, fmt.Errorf("fetch %s: the artifact cache evicted it at once; raise --artifact-cache-max-bytes", a.revision)
		}
	}
	a.artifact, a.release = art, release
	// The remote may have moved between the check and the fetch; the
	// artifact's revision is the one that is rendered and recorded.
	a.revision = art.Revision
	return false, nil
}

// waitForSource ends an attempt that waits for an operation on its
// source (sourceops.go): the attempt writes nothing and holds no worker;
// the operation's end wakes the deployment, and should that wake be
// lost, the deployment comes back once the operation's deadline passed.
func (r *Reconciler) waitForSource(a *attempt) (bool, error) {
	a.pending = true
	a.requeue = a.cd.Spec.TimeoutOrDefault() + sourceWakeSlack
	return true, nil
}

// sourceWakeSlack is how long after a source operation's deadline a
// deployment that waits for it comes back by itself.
const sourceWakeSlack = 10 * time.Second

// unpin lets the store evict the attempt's artifact.
func (a *attempt) unpin() {
	if a.release != nil {
		a.release()
		a.release = nil
	}
}

// bounded runs s under the deployment's spec.timeout: a batch of API
// requests that does not end in time fails the attempt, which is
// retried, instead of holding its worker.
func bounded(s step) step {
	return func(ctx context.Context, a *attempt) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, a.cd.Spec.TimeoutOrDefault())
		defer cancel()
		return s(ctx, a)
	}
}

package reconciler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/sources/git"
)

// RootLabel marks ClusterDeployments applied from a root source; its value
// identifies the root (a hash of URL, branch and path).
const RootLabel = "capstan.dev/root"

// RootFileAnnotation records the file a root ClusterDeployment came from.
const RootFileAnnotation = "capstan.dev/source-file"

// defaultRootNamespace is where root ClusterDeployments that name no
// namespace go when RootOptions.Namespace is not set.
const defaultRootNamespace = "capstan-system"

// rootFieldManager applies root ClusterDeployments, apart from the
// reconciler's own status writes.
const rootFieldManager = "capstan-root"

// RootOptions name the root source: one branch of one repository, and the
// path under which every committed ClusterDeployment is managed.
type RootOptions struct {
	URL, Branch, Path string
	Auth              git.Auth
	// Namespace is given to ClusterDeployments that name none. Its
	// deployments, and those of Capstan's own namespace, may read the
	// root source: name no spec.source (docs/root-source.md).
	Namespace string
	// Namespaces are further namespaces whose deployments may read the
	// root source (`capstan run --root-source-namespaces`). A deployment
	// without spec.source in any other namespace stalls.
	Namespaces []string
	// Interval is how often the root is polled.
	Interval time.Duration
	// Source overrides the git source built from URL (tests, other kinds).
	Source sources.Source
}

// rootCredentials names where the root source's credentials are set: the
// flags of capstan run, which its authentication errors point to.
var rootCredentials = git.CredentialsFrom{
	HTTP:       "--source-username and $CAPSTAN_SOURCE_PASSWORD of capstan run (the root source)",
	SSHKey:     "--source-ssh-key-file of capstan run (the root source)",
	KnownHosts: "--source-known-hosts-file of capstan run (the root source)",
	CA:         "--source-ca-file or $CAPSTAN_SOURCE_CA of capstan run (the root source; installed: key CAPSTAN_SOURCE_CA of Secret capstan-secrets)",
}

// rootSource is a manager runnable that keeps the set of ClusterDeployments
// in the cluster equal to the set committed under the root path. A
// deployment removed from git is deleted from the cluster; what it applied
// follows its deletion policy (finalize).
type rootSource struct {
	opts   RootOptions
	id     string
	client client.Client
	entry  *sourceEntry

	kick chan struct{}

	mu      sync.Mutex
	last    string // revision fully synced
	lastErr error
	count   int
	broken  string // revision whose files do not all parse
}

// RootStatus is what the root source last did.
type RootStatus struct {
	// Revision is the last revision whose ClusterDeployments were all
	// applied; empty until one was.
	Revision string
	// Deployments is how many ClusterDeployments that revision holds.
	Deployments int
	// Err is the last sync's error, nil when it succeeded.
	Err error
}

func (s *rootSource) status() RootStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return RootStatus{Revision: s.last, Deployments: s.count, Err: s.lastErr}
}

// newRootSource builds the root source and makes it the one of cache,
// serving the deployments without a source of home (Capstan's namespace,
// "" when it has none), opts.Namespace and opts.Namespaces.
func newRootSource(opts RootOptions, c client.Client, cache *sourceCache, home string) (*rootSource, error) {
	if opts.Branch == "" {
		opts.Branch = "main"
	}
	if opts.Namespace == "" {
		opts.Namespace = defaultRootNamespace
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	src := opts.Source
	if src == nil {
		var err error
		if src, err = git.New(git.Options{URL: opts.URL, Branch: opts.Branch, Auth: opts.Auth, CredentialsFrom: rootCredentials}); err != nil {
			return nil, fmt.Errorf("root source: %w", err)
		}
	}
	cache.set(rootSourceKey, src)
	cache.mu.Lock()
	cache.rootNamespaces = rootNamespacesOf(opts, home)
	cache.mu.Unlock()
	entry, _ := cache.lookup(rootSourceKey)
	sum := sha256.Sum256([]byte(opts.URL + "\x00" + opts.Branch + "\x00" + path.Clean(opts.Path)))
	return &rootSource{opts: opts, id: hex.EncodeToString(sum[:])[:16], client: c, entry: entry, kick: make(chan struct{}, 1)}, nil
}

// Start polls the root until ctx ends.
func (s *rootSource) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("root")
	ticker := time.NewTicker(s.opts.Interval)
	defer ticker.Stop()
	for {
		err := s.sync(ctx)
		if ctx.Err() != nil {
			return nil
		}
		s.mu.Lock()
		s.lastErr = err
		s.mu.Unlock()
		if err != nil {
			logger.Error(err, "sync root source", "url", redact(s.opts.URL), "path", s.opts.Path)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-s.kick:
		}
	}
}

// kickNow makes the root sync at once instead of at the next tick; kicks
// while one is pending coalesce.
func (s *rootSource) kickNow() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// NeedLeaderElection makes only the leader apply root deployments.
func (s *rootSource) NeedLeaderElection() bool { return true }

func (s *rootSource) sync(ctx context.Context) error {
	// The root asks the remote at every tick and kick; deployments
	// reading the root share its answer. Each operation on the remote
	// ends within DefaultTimeout, as a deployment's would without
	// spec.timeout.
	ctx, cancel := context.WithTimeout(ctx, 2*capstanv1.DefaultTimeout)
	defer cancel()
	rev, err := s.entry.revision(ctx, 0)
	if err != nil {
		return fmt.Errorf("check root source: %w", err)
	}
	st := s.status()
	if rev == st.Revision {
		return nil
	}
	if rev == s.broken {
		// Only a new commit can fix a file that does not parse.
		return st.Err
	}
	art, _, err := s.entry.fetch(ctx, rev)
	if err != nil {
		return fmt.Errorf("fetch root source %s: %w", rev, err)
	}
	objs, loadErr := render.LoadManifests(art.FS, s.opts.Path, func(apiVersion, kind string) bool {
		return apiVersion == capstanv1.GroupVersion.String() && kind == capstanv1.ClusterDeploymentKind
	})
	var errs []error
	if loadErr != nil {
		errs = append(errs, fmt.Errorf("read ClusterDeployments under %s at %s: %w", s.opts.Path, art.Revision, loadErr))
	}
	keep := map[client.ObjectKey]bool{}
	for _, obj := range objs {
		if obj.GetNamespace() == "" {
			obj.SetNamespace(s.opts.Namespace)
		}
		labels := obj.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels[RootLabel] = s.id
		obj.SetLabels(labels)
		keep[client.ObjectKeyFromObject(obj)] = true
		if err := s.apply(ctx, obj); err != nil {
			errs = append(errs, err)
		}
	}
	// With a file that could not be read, the set is incomplete: deleting
	// what is missing could stop managing a cluster whose file is only broken.
	if loadErr == nil {
		if err := s.forgetRemoved(ctx, keep); err != nil {
			errs = append(errs, err)
		}
	} else if len(errs) == 1 {
		s.broken = rev
	}
	if len(errs) == 0 {
		s.mu.Lock()
		s.last, s.count = rev, len(objs)
		s.mu.Unlock()
		log.FromContext(ctx).Info("root source synced", "revision", rev, "deployments", len(objs))
	}
	return errors.Join(errs...)
}

func (s *rootSource) apply(ctx context.Context, obj *unstructured.Unstructured) error {
	obj.SetManagedFields(nil)
	if err := s.client.Patch(ctx, obj, client.Apply, client.FieldOwner(rootFieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("apply ClusterDeployment %s/%s from %s: %w",
			obj.GetNamespace(), obj.GetName(), obj.GetAnnotations()[RootFileAnnotation], err)
	}
	return nil
}

func (s *rootSource) forgetRemoved(ctx context.Context, keep map[client.ObjectKey]bool) error {
	list := &capstanv1.ClusterDeploymentList{}
	if err := s.client.List(ctx, list, client.MatchingLabels{RootLabel: s.id}); err != nil {
		return fmt.Errorf("list root ClusterDeployments: %w", err)
	}
	var errs []error
	for i := range list.Items {
		cd := &list.Items[i]
		if keep[client.ObjectKeyFromObject(cd)] {
			continue
		}
		if err := s.client.Delete(ctx, cd); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("stop managing ClusterDeployment %s/%s: %w", cd.Namespace, cd.Name, err))
			continue
		}
		log.FromContext(ctx).Info("ClusterDeployment removed from the root source; no longer managed, its objects are kept",
			"clusterDeployment", cd.Namespace+"/"+cd.Name)
	}
	return errors.Join(errs...)
}

// ReasonSourceNotServed: a deployment without spec.source in a namespace
// the root source does not serve (docs/root-source.md). Like every reason
// of a source failure, it starts with "Source".
const ReasonSourceNotServed = "SourceRootNotServed"

// rootNamespacesOf returns the namespaces whose deployments without a
// source of their own read the root source: Capstan's own (home: the
// pod's namespace, "" outside a pod), the one root deployments that name
// none are created in (opts.Namespace), and those opts.Namespaces lists
// (`capstan run --root-source-namespaces`). Any other namespace is a
// tenant's: the root repository is the platform's, and so are its
// credentials.
func rootNamespacesOf(opts RootOptions, home string) map[string]bool {
	out := map[string]bool{}
	if opts.Namespace == "" {
		opts.Namespace = defaultRootNamespace
	}
	for _, ns := range append([]string{home, opts.Namespace}, opts.Namespaces...) {
		if ns = strings.TrimSpace(ns); ns != "" {
			out[ns] = true
		}
	}
	return out
}

// rootServes reports whether the root source serves the deployments of
// namespace ns that name no source of their own.
func (c *sourceCache) rootServes(ns string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rootNamespaces[ns]
}

// notServed is the error of a deployment without a source in namespace ns,
// which the root source does not serve.
func (c *sourceCache) notServed(ns string) error {
	c.mu.Lock()
	served := slices.Sorted(maps.Keys(c.rootNamespaces))
	c.mu.Unlock()
	return failure.Stalled(ReasonSourceNotServed, fmt.Errorf("spec.source: not set, and the root source serves only ClusterDeployments in Capstan's namespace "+
		"and those capstan run --root-source-namespaces lists (%s), not namespace %s: "+
		"set spec.source.git.url or spec.source.oci.url to a repository of your own, or ask the platform to add %s to --root-source-namespaces",
		strings.Join(served, ", "), ns, ns))
}

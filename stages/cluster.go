package stages

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// Cluster is a connection to one cluster: the one Capstan runs in, or
// another one reached through a kubeconfig. The executor applies, waits
// and validates through it, so the cluster a stage acts on is a choice of
// the caller, and the bootstrap and the target cluster of a pivot are
// interchangeable.
type Cluster interface {
	// Name says which cluster this is, in messages: "local" or the
	// kubeconfig Secret it was built from. It never holds credentials.
	Name() string
	// Client reads, writes and watches objects in the cluster.
	Client() client.WithWatch
	// RESTMapper maps kinds to the cluster's resources (discovery).
	RESTMapper() meta.RESTMapper
	// CheckAvailable returns an error when the cluster cannot be
	// reached now; nil for the cluster Capstan runs in, whose reachability
	// the daemon's own health covers.
	CheckAvailable(ctx context.Context) error
}

// LocalClusterName is the Name of the cluster Capstan runs in.
const LocalClusterName = "local"

// LocalCluster returns the connection to the cluster Capstan runs in,
// through c.
func LocalCluster(c client.WithWatch) Cluster { return localCluster{c: c} }

type localCluster struct{ c client.WithWatch }

var _ Cluster = localCluster{}

func (l localCluster) Name() string             { return LocalClusterName }
func (l localCluster) Client() client.WithWatch { return l.c }

func (l localCluster) RESTMapper() meta.RESTMapper {
	if l.c == nil {
		return nil
	}
	return l.c.RESTMapper()
}

func (l localCluster) CheckAvailable(context.Context) error { return nil }

// remoteCluster is a connection built from a kubeconfig.
type remoteCluster struct {
	name      string
	client    client.WithWatch
	discovery discovery.DiscoveryInterface
	config    *rest.Config
	// uid is the cluster's identity, learnt once (ClusterUID).
	uid clusterUID
}

var _ Cluster = (*remoteCluster)(nil)

// RESTConfig is how the cluster is reached; Capstan installing itself
// there points its pods at the same API server.
func (r *remoteCluster) RESTConfig() *rest.Config { return rest.CopyConfig(r.config) }

// Discovery lists the kinds the cluster serves.
func (r *remoteCluster) Discovery() discovery.DiscoveryInterface { return r.discovery }

// availableTimeout bounds CheckAvailable, so that a cluster that does not
// answer (a black-holed address) costs seconds, not the dialer's 30 s.
const availableTimeout = 5 * time.Second

// NewKubeconfigCluster returns a connection to the cluster kubeconfig
// reaches through its current context. name says where the kubeconfig
// came from ("Secret ns/name"); errors name it, never the kubeconfig's
// content. Only the fields that say where and how to connect are used: a
// field that runs a command, reads a file or turns TLS verification off
// is refused (a *KubeconfigRefusedError, stalled) unless opts allow it
// (CheckKubeconfig). Nothing is requested from the cluster yet: a cluster
// that is down still gives a connection, whose CheckAvailable says so.
func NewKubeconfigCluster(name string, kubeconfig []byte, scheme *runtime.Scheme, opts ...KubeconfigOption) (Cluster, error) {
	var settings kubeconfigSettings
	for _, o := range opts {
		o(&settings)
	}
	cfg, err := restConfigFrom(kubeconfig, settings.policy)
	if err != nil {
		return nil, err
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, errors.New("cannot build an HTTP client from it (check its certificates and keys)")
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("build a REST mapper: %w", err)
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme, HTTPClient: httpClient, Mapper: mapper})
	if err != nil {
		return nil, fmt.Errorf("build a client: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("build a discovery client: %w", err)
	}
	return &remoteCluster{name: name, client: c, discovery: dc, config: rest.CopyConfig(cfg)}, nil
}

func (r *remoteCluster) Name() string                { return r.name }
func (r *remoteCluster) Client() client.WithWatch    { return r.client }
func (r *remoteCluster) RESTMapper() meta.RESTMapper { return r.client.RESTMapper() }

// CheckAvailable asks the API server for its version: an unauthenticated
// read every API server answers, so any error means the cluster cannot be
// used now.
func (r *remoteCluster) CheckAvailable(ctx context.Context) error {
	probe, cancel := context.WithTimeout(ctx, availableTimeout)
	defer cancel()
	res := r.discovery.RESTClient().Get().AbsPath("/version").Do(probe)
	if err := res.Error(); err != nil {
		if probe.Err() != nil && ctx.Err() == nil {
			return fmt.Errorf("no answer to GET /version within %s", availableTimeout)
		}
		return err
	}
	var code int
	if res.StatusCode(&code); code != http.StatusOK {
		return fmt.Errorf("GET /version: HTTP %d", code)
	}
	return nil
}

// checkAvailable asks the executor's cluster whether it answers before a
// stage acts on it. A cluster that does not is waited for: the result is
// InProgress with an UnreachableError naming the cluster.
func (e *Executor) checkAvailable(ctx context.Context, stage *Stage) (Result, bool) {
	if e.cluster == nil {
		return Result{}, false
	}
	err := e.cluster.CheckAvailable(ctx)
	if err == nil {
		return Result{}, false
	}
	if ctx.Err() != nil {
		// The attempt ended while asking; nothing was learnt about the cluster.
		return Result{Stage: stage.Name, State: capstanv1.StageInProgress, Message: "waiting for cluster of " + e.cluster.Name()}, true
	}
	return Unreachable(stage.Name, &UnreachableError{Cluster: e.cluster.Name(), Err: err}), true
}

// unreachableAsWaiting turns a failed attempt on a remote cluster whose
// cause is the path to that cluster (it went away during the attempt, or
// answers for none of its objects: IsUnanswered, as a diff judges it) into
// waiting for it. The cluster Capstan runs in is never judged so: if it
// does not answer, the daemon cannot record anything either.
func (e *Executor) unreachableAsWaiting(res Result) Result {
	if res.State != capstanv1.StageFailed || !e.remote() || IsStalled(res.Err) || !IsUnanswered(res.Err) {
		return res
	}
	changes, applied := res.ChangeSet, res.Applied
	res = Unreachable(res.Stage, &UnreachableError{Cluster: e.cluster.Name(), Err: res.Err})
	res.ChangeSet, res.Applied = changes, applied
	return res
}

// Unreachable is the result of an attempt at stage that waits for its
// cluster: InProgress, with err (an UnreachableError) as its message.
func Unreachable(stage string, err error) Result {
	return Result{Stage: stage, State: capstanv1.StageInProgress, Err: err, Message: err.Error()}
}

// remote reports whether the executor acts on another cluster than the
// one Capstan runs in.
func (e *Executor) remote() bool {
	_, local := e.cluster.(localCluster)
	return e.cluster != nil && !local
}

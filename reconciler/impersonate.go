package reconciler

import (
	"context"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// A deployment that names a ServiceAccount (spec.serviceAccountName, or
// the daemon's --default-service-account) has what Capstan does to its
// objects in the cluster Capstan runs in done as that ServiceAccount:
// the API server impersonates it, so its RBAC bounds what the deployment
// can create, change or delete, as Flux's serviceAccountName does. What
// Capstan does for itself keeps Capstan's identity: its own
// ClusterDeployments and their status, the owner lookups that keep one
// owner per object, the drift watch's reads, the bootstrap key.

// actors builds and keeps one client per ServiceAccount Capstan acts as,
// while a deployment uses it.
type actors struct {
	config *rest.Config
	scheme *runtime.Scheme
	mapper meta.RESTMapper

	mu      sync.Mutex
	clients map[string]client.WithWatch
	// users are the deployments (namespace/name) that act as each user.
	users map[string]map[string]bool
}

func newActors(config *rest.Config, scheme *runtime.Scheme, mapper meta.RESTMapper) *actors {
	return &actors{config: config, scheme: scheme, mapper: mapper,
		clients: map[string]client.WithWatch{}, users: map[string]map[string]bool{}}
}

// serviceAccountUser is the user name of ServiceAccount name in namespace
// ns; impersonating it, the API server adds the ServiceAccount groups.
func serviceAccountUser(ns, name string) string {
	return "system:serviceaccount:" + ns + ":" + name
}

// client returns the client that acts as user for deployment cd
// ("namespace/name"), made once per user (actingAs).
func (a *actors) client(user, cd string) (client.WithWatch, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for other, users := range a.users {
		if other != user && users[cd] {
			a.leave(other, cd) // the deployment names another one now
		}
	}
	if a.users[user] == nil {
		a.users[user] = map[string]bool{}
	}
	a.users[user][cd] = true
	if c, ok := a.clients[user]; ok {
		return c, nil
	}
	c, err := actingAs(a.config, a.scheme, a.mapper, user)
	if err != nil {
		return nil, err
	}
	a.clients[user] = c
	return c, nil
}

// actingAs returns a client on the cluster of config that acts as user:
// the API server impersonates it. It shares mapper, and client-go the
// connections (its transport cache is keyed by TLS settings).
func actingAs(config *rest.Config, scheme *runtime.Scheme, mapper meta.RESTMapper, user string) (client.WithWatch, error) {
	cfg := rest.CopyConfig(config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme, Mapper: mapper})
	if err != nil {
		return nil, fmt.Errorf("client acting as %s: %w", user, err)
	}
	return c, nil
}

// actorName is how messages name the ServiceAccount of user
// ("namespace/name").
func actorName(user string) string {
	return strings.TrimPrefix(strings.ReplaceAll(user, ":", "/"), "system/serviceaccount/")
}

// forget drops deployment cd's use of its ServiceAccount's client, and
// the client when no deployment uses it any more.
func (a *actors) forget(cd string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for user, users := range a.users {
		if users[cd] {
			a.leave(user, cd)
		}
	}
}

// leave drops cd from user's users; a.mu is held.
func (a *actors) leave(user, cd string) {
	delete(a.users[user], cd)
	if len(a.users[user]) == 0 {
		delete(a.users, user)
		delete(a.clients, user)
	}
}

// len is how many clients are kept, for tests.
func (a *actors) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.clients)
}

// actorOf returns the user Capstan acts as for cd's objects in its own
// cluster: "" for Capstan itself.
func (r *Reconciler) actorOf(cd *capstanv1.ClusterDeployment) string {
	name := cd.Spec.ServiceAccountName
	if name == "" {
		name = r.opts.DefaultServiceAccount
	}
	if name == "" {
		return ""
	}
	return serviceAccountUser(cd.Namespace, name)
}

// local returns the executor for cd's objects in the cluster Capstan
// runs in: Capstan's own, or one that acts as cd's ServiceAccount (its
// ClusterDeployment reads, owner lookups and fencing stay Capstan's).
func (r *Reconciler) local(cd *capstanv1.ClusterDeployment) (*stages.Executor, error) {
	user := r.actorOf(cd)
	if r.actors == nil {
		return r.executor, nil
	}
	if user == "" {
		r.actors.forget(cd.Namespace + "/" + cd.Name) // it may have named one before
		return r.executor, nil
	}
	c, err := r.actors.client(user, cd.Namespace+"/"+cd.Name)
	if err != nil {
		return nil, err
	}
	return r.executor.As(c, actorName(user)), nil
}

// lockedOut reports whether err, from deleting the objects of cd, which
// is being deleted, is its ServiceAccount refused while cd's namespace
// is being deleted: the namespace's RoleBindings (and the ServiceAccount)
// go with it, so the permission will not come back.
func (r *Reconciler) lockedOut(ctx context.Context, cd *capstanv1.ClusterDeployment, err error) bool {
	if r.actorOf(cd) == "" || !apierrors.IsForbidden(err) {
		return false
	}
	ns := &corev1.Namespace{}
	switch err := r.client.Get(ctx, client.ObjectKey{Name: cd.Namespace}, ns); {
	case apierrors.IsNotFound(err):
		return true
	case err != nil:
		return false
	}
	return ns.DeletionTimestamp != nil
}

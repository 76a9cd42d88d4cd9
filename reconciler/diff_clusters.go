package reconciler

import (
	"context"
	"fmt"
	"slices"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// A preview compares each stage with the cluster the stage acts on, as the
// walk applies it: the cluster Capstan runs in, or the one a kubeconfig
// (the stage's, else the deployment's) reaches. A stage whose cluster
// does not exist yet (its kubeconfig Secret is written once Cluster API
// built it) or does not answer is listed as not compared, with why; the
// other stages are compared as usual.

// clusterDiffer compares plans with the clusters their stages act on.
type clusterDiffer struct {
	home     *stages.Executor
	clusters *clusterCache
}

// diff compares plan with the clusters of its stages.
func (d clusterDiffer) diff(ctx context.Context, cd *capstanv1.ClusterDeployment, plan *stages.Plan, opts stages.DiffOptions) (*stages.PlanDiff, error) {
	parts, err := d.parts(ctx, cd, plan)
	if err != nil {
		return nil, err
	}
	owner := stages.Owner{Name: cd.Name, Namespace: cd.Namespace}
	return stages.DiffParts(ctx, plan, owner, opts, parts, func(s capstanv1.InventoryStage) (*stages.Executor, error) {
		key, err := inventoryKey(cd, s, d.clusters.rules)
		if err != nil {
			return nil, err
		}
		if key == localRef {
			return d.home, nil
		}
		return d.via(ctx, cd, key)
	})
}

// parts groups the plan's stages by the cluster each acts on, the
// deployment's own cluster first.
func (d clusterDiffer) parts(ctx context.Context, cd *capstanv1.ClusterDeployment, plan *stages.Plan) ([]stages.PlanPart, error) {
	home := stages.PlanPart{Executor: d.home, Home: true}
	var others []stages.PlanPart
	byKey := map[clusterKey]int{}
	add := func(key clusterKey, i int) error {
		if n, ok := byKey[key]; ok {
			others[n].Stages = append(others[n].Stages, i)
			return nil
		}
		part := stages.PlanPart{Stages: []int{i}, Cluster: "Secret " + key.namespace + "/" + key.secret}
		exec, err := d.via(ctx, cd, key)
		switch {
		case stages.IsUnreachable(err), stages.IsStalled(err):
			// A kubeconfig refused (docs/kubeconfigs.md) is not compared
			// either: the walk stalls on it, and the plan says why.
			part.NotCompared = err.Error()
		case err != nil:
			return err
		default:
			part.Executor = exec
		}
		byKey[key] = len(others)
		others = append(others, part)
		return nil
	}
	objects := plan.AppliedObjects()
	pivoted := -1 // the pivot stage, when the deployment has not moved yet
	for i := range plan.Stages {
		stage := &plan.Stages[i]
		ref := kubeConfigFor(cd, stage)
		switch {
		case stage.Action == capstanv1.StageActionPivot:
			// Its objects are moved, not applied: nothing to compare.
			home.Stages = append(home.Stages, i)
			if cd.Annotations[pivot.ArrivedAnnotation] == "" && pivoted < 0 {
				pivoted = i
			}
			continue
		case pivoted >= 0 && stage.KubeConfig != nil:
			// After the pivot the deployment lives in the cluster it
			// moved to, and so does the Secret this kubeconfig names.
			others = append(others, stages.PlanPart{Stages: []int{i},
				NotCompared: "the stage runs after the pivot, through a kubeconfig Secret of the cluster the pivot moves the deployment to; the Capstan there compares it"})
			continue
		case pivoted >= 0:
			// Applied by the Capstan of the cluster the pivot moves to,
			// into that cluster: the one the pivot stage reaches.
			ref = kubeConfigFor(cd, &plan.Stages[pivoted])
		}
		if ref == nil {
			home.Stages = append(home.Stages, i)
			continue
		}
		key, err := resolveKubeConfig(cd, ref, objects)
		if err != nil {
			others = append(others, stages.PlanPart{Stages: []int{i}, NotCompared: err.Error()})
			continue
		}
		if err := add(key, i); err != nil {
			return nil, err
		}
	}
	return slices.Insert(others, 0, home), nil
}

// via returns the executor on the cluster of the kubeconfig at key.
func (d clusterDiffer) via(ctx context.Context, cd *capstanv1.ClusterDeployment, key clusterKey) (*stages.Executor, error) {
	cluster, err := d.clusters.get(ctx, cd, key)
	if err != nil {
		return nil, err
	}
	return d.home.On(cluster).Via(key.namespace, key.secret, key.key), nil
}

// previewDeployment is the deployment a preview compares for: cd's
// identity and annotations with spec, or a new one named owner.
func previewDeployment(owner stages.Owner, spec capstanv1.ClusterDeploymentSpec, live *capstanv1.ClusterDeployment) *capstanv1.ClusterDeployment {
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Name: owner.Name, Namespace: owner.Namespace}, Spec: spec}
	if live != nil {
		cd.Annotations = live.Annotations
	}
	return cd
}

// PreviewOptions say as whom DiffPreview compares.
type PreviewOptions struct {
	// ServiceAccount, when set, names the ServiceAccount of the
	// deployment's namespace that the deployment's objects in the cluster
	// of c are dry-run and read as, as the daemon applies them
	// (spec.serviceAccountName, else capstan run's
	// --default-service-account). What the daemon does as itself (reading
	// ClusterDeployments for the owner lookups, the kubeconfig Secrets)
	// keeps c's identity, and so do the stages on other clusters.
	ServiceAccount string
	// Config is c's REST config; the client that acts as ServiceAccount
	// is made from it.
	Config *rest.Config
	// Kubeconfigs says what the kubeconfig Secrets read may hold beyond
	// what only connects (docs/kubeconfigs.md); the zero value allows no
	// exec plugin and no insecure TLS: a tenant's Secret never runs a
	// command on the machine of whoever previews.
	Kubeconfigs stages.KubeconfigPolicy
}

// DiffPreview compares plan, a revision of a deployment, with every
// cluster its stages act on: the cluster of c, and those the kubeconfig
// Secrets that the deployment and its stages name reach (read through c).
// owner names the deployment, spec is the spec to compare with (a file's,
// or the live deployment's), live the deployment in the cluster or nil.
// It is what `capstan diff` shows; the pull request comments use the same.
// When c's user may not act as opts.ServiceAccount, the error is an
// *ImpersonationError and nothing is compared.
func DiffPreview(ctx context.Context, c client.WithWatch, owner stages.Owner, spec capstanv1.ClusterDeploymentSpec, live *capstanv1.ClusterDeployment, plan *stages.Plan, opts PreviewOptions) (*stages.PlanDiff, error) {
	home := stages.NewExecutor(c)
	rules := &kubeconfigRules{policy: opts.Kubeconfigs, homeID: homeIdentity(c)}
	if opts.ServiceAccount != "" {
		rules.actorOf = func(cd *capstanv1.ClusterDeployment) string {
			return serviceAccountUser(cd.Namespace, opts.ServiceAccount)
		}
		user := serviceAccountUser(owner.Namespace, opts.ServiceAccount)
		as, err := actingAs(opts.Config, c.Scheme(), c.RESTMapper(), user)
		if err != nil {
			return nil, err
		}
		if err := mayActAs(ctx, as, owner.Namespace, opts.ServiceAccount); err != nil {
			return nil, err
		}
		home = home.As(as, actorName(user))
	}
	d := clusterDiffer{home: home, clusters: newClusterCache(c, c.Scheme(), rules)}
	return d.diff(ctx, previewDeployment(owner, spec, live), plan, DiffOptionsFor(spec, live))
}

// ImpersonationError says that the caller of a preview may not act as
// the deployment's ServiceAccount, and what RBAC would let it.
type ImpersonationError struct {
	// Namespace and Name are the ServiceAccount's.
	Namespace, Name string
	Err             error
}

func (e *ImpersonationError) Error() string {
	return fmt.Sprintf("act as ServiceAccount %s/%s (user %s), as the daemon applies the deployment's objects: %v; "+
		"the caller needs the RBAC verb impersonate on resource serviceaccounts (core API group) named %s in namespace %s",
		e.Namespace, e.Name, serviceAccountUser(e.Namespace, e.Name), e.Err, e.Name, e.Namespace)
}

func (e *ImpersonationError) Unwrap() error { return e.Err }

// mayActAs asks the API server something harmless as the client acting
// as ServiceAccount ns/name: impersonation is checked before anything
// else, so a caller that may not impersonate is told here, once, rather
// than as a refusal of every object. What the ServiceAccount itself may
// not do is left to the objects.
func mayActAs(ctx context.Context, as client.Client, ns, name string) error {
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "get", Resource: "serviceaccounts", Name: name}}}
	err := as.Create(ctx, review)
	switch {
	case err == nil:
		return nil
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "cannot impersonate"):
		return &ImpersonationError{Namespace: ns, Name: name, Err: err}
	case stages.IsUnanswered(err):
		return err
	}
	return nil // the ServiceAccount may not ask, but it was acted as
}

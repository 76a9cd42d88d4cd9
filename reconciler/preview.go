package reconciler

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/sources/git"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// This file holds what a preview of a revision needs, a revision a
// deployment is not (yet) walking: `capstan diff` and the plan comments on
// pull requests render and plan it exactly as a reconcile would, then
// dry-run it against the live cluster.

// PlanInput is a tree to plan for a deployment.
type PlanInput struct {
	// FS is the tree, rooted where the source's artifact is.
	FS fs.FS
	// Where names FS in errors (the --root directory); empty for an
	// artifact, whose paths are relative to the repository.
	Where string
	// Spec gives the path, the substitutions and the stages.
	Spec capstanv1.ClusterDeploymentSpec
	// Live is the deployment in the cluster, nil when there is none.
	Live *capstanv1.ClusterDeployment
	// Render bounds the render (its limits); its Path and Substitute are
	// taken from Spec, with Substitute's entries added.
	Render render.Options
}

// PlanTree renders the deployment's path of in.FS and builds its plan, as
// a reconcile does: the spec's substitutions, its stages or profile, and
// for a deployment that moved here, without its bootstrap-only objects.
// A render error keeps its file, object and field (render.Error).
func PlanTree(ctx context.Context, in PlanInput) (*stages.Plan, error) {
	opts := in.Render
	opts.Path = in.Spec.Path
	subst := maps.Clone(in.Spec.Substitute)
	if len(opts.Substitute) > 0 {
		if subst == nil {
			subst = map[string]string{}
		}
		maps.Copy(subst, opts.Substitute)
	}
	opts.Substitute = subst
	res, err := render.BuildResult(ctx, in.FS, opts)
	if err == nil {
		err = res.UnsetErr()
	}
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", filepath.Join(in.Where, in.Spec.Path), err)
	}
	objs := res.Objects
	specs, err := stages.StageSpecs(in.Spec)
	if err != nil {
		return nil, err
	}
	plan, err := stages.BuildPlan(specs, objs)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	plan.Files = map[*unstructured.Unstructured]string{}
	for i, obj := range objs {
		if f := res.Files[i]; f != "" {
			plan.Files[obj] = filepath.Join(in.Where, f)
		}
	}
	if in.Live != nil && in.Live.Annotations[pivot.ArrivedAnnotation] != "" {
		plan.Drop(func(obj *unstructured.Unstructured) bool {
			return obj.GetLabels()[stages.BootstrapOnlyLabel] == "true"
		})
	}
	return plan, nil
}

// DiffOptionsFor returns how a preview is compared with the cluster: the
// live deployment's inventory (what a revision that drops objects prunes)
// and prune policy, or the spec's when there is no live deployment.
func DiffOptionsFor(spec capstanv1.ClusterDeploymentSpec, live *capstanv1.ClusterDeployment) stages.DiffOptions {
	opts := stages.DiffOptions{NewRevision: live != nil}
	switch {
	case live != nil:
		opts.Inventory = live.Status.Inventory
		opts.Destructive = live.Spec.Prune != nil && live.Spec.Prune.Destructive
	case spec.Prune != nil:
		opts.Destructive = spec.Prune.Destructive
	}
	return opts
}

// GitAuth reads git credentials from the Secret of a source's secretRef
// (git.AuthFromSecret: username and password or a token for https,
// identity and known_hosts for ssh, ca.crt for a private CA). Its error
// names the Secret and the key, never a value.
func GitAuth(s *corev1.Secret) (git.Auth, error) {
	if s == nil {
		return git.Auth{}, nil
	}
	auth, err := git.AuthFromSecret(s.Data)
	if err != nil {
		return git.Auth{}, failure.Stalled(sources.ReasonSourceInvalid, fmt.Errorf("spec.source.git.secretRef: Secret %s/%s: %w", s.Namespace, s.Name, err))
	}
	return auth, nil
}

// RefFetch says which ref of which repository FetchRef fetches.
type RefFetch struct {
	URL  string
	Auth git.Auth
	// Ref is a full ref name, e.g. refs/pull/7/head.
	Ref string
	// Limits and CacheDir are the daemon's (zero: the defaults, in
	// memory).
	Limits   sources.Limits
	CacheDir string
	// Secret is the Secret Auth came from ("namespace/name"), for the
	// hints of its errors; empty when there is none.
	Secret string
}

// FetchRef fetches one ref of a repository through the normal git source,
// e.g. the head of a pull request (forks included: the base repository
// holds it). The caller removes the artifact (Artifact.Remove).
func FetchRef(ctx context.Context, in RefFetch) (*sources.Artifact, error) {
	opts := git.Options{URL: in.URL, Ref: git.Ref{Name: in.Ref}, Auth: in.Auth, Limits: in.Limits, CacheDir: in.CacheDir}
	opts.CredentialsFrom.CA = sources.CAKeyOf("spec.source.git.secretRef", in.Secret)
	src, err := git.New(opts)
	if err != nil {
		return nil, err
	}
	art, err := src.Fetch(ctx)
	if err != nil {
		return nil, fmt.Errorf("fetch %s: %w", in.Ref, err)
	}
	return art, nil
}

package report

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
	"github.com/capstan-dev/capstan/sources/git"
	"github.com/capstan-dev/capstan/stages/pivot"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// listGroups reads the deployments that report to pull requests and groups
// them by forge, repository and branch.
func (w *PullRequests) listGroups(ctx context.Context) ([]*group, error) {
	list := &capstanv1.ClusterDeploymentList{}
	if err := w.client.List(ctx, list); err != nil {
		return nil, err
	}
	byKey := map[string]*group{}
	for i := range list.Items {
		cd := &list.Items[i]
		if cd.Spec.Report == nil || cd.Spec.Report.PullRequests == nil || !cd.DeletionTimestamp.IsZero() ||
			cd.Annotations[pivot.MirrorAnnotation] != "" {
			continue
		}
		g, err := groupOf(cd, w.opts.Root)
		if err != nil {
			w.complain(ctx, cd, err.Error())
			continue
		}
		w.complain(ctx, cd, "")
		if have := byKey[g.key]; have != nil {
			have.members = append(have.members, cd)
			have.interval = min(have.interval, g.interval)
			continue
		}
		byKey[g.key] = g
	}
	out := make([]*group, 0, len(byKey))
	for _, g := range byKey {
		slices.SortFunc(g.members, func(a, b *capstanv1.ClusterDeployment) int {
			return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
		})
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b *group) int { return cmp.Compare(a.key, b.key) })
	return out, nil
}

// PullRequestGroup is the key of the deployments whose pull requests are
// watched together, those of one branch of one repository of one forge:
// sharded, the replica that owns the key handles them.
func PullRequestGroup(provider forge.Provider, baseURL, repo, branch string) string {
	return fmt.Sprintf("%s|%s|%s|%s", provider, baseURL, repo, branch)
}

// groupOf returns the group of one deployment, or why its pull requests
// cannot be watched.
func groupOf(cd *capstanv1.ClusterDeployment, root *Root) (*group, error) {
	pr := cd.Spec.Report.PullRequests
	var url, branch string
	switch src := cd.Spec.Source; {
	case src != nil && src.Git != nil:
		ref := src.Git.Ref
		if ref.Tag != "" || ref.SemVer != "" || ref.Commit != "" || ref.Name != "" {
			return nil, errors.New("spec.report.pullRequests: the deployment follows a tag, a commit or a ref, not a branch: no pull request is merged into it")
		}
		url, branch = src.Git.URL, branchOr(ref.Branch, git.DefaultBranch)
	case src != nil:
		return nil, errors.New("spec.report.pullRequests: the deployment reads an OCI artifact, not a git repository")
	case root != nil && root.URL != "":
		url, branch = root.URL, branchOr(root.Branch, git.DefaultBranch)
	default:
		return nil, errors.New("spec.report.pullRequests: the deployment reads no git repository")
	}
	repo := pr.Repository
	if repo == "" {
		var err error
		if repo, err = forge.RepositoryFromURL(url, pr.BaseURL); err != nil {
			return nil, fmt.Errorf("spec.report.pullRequests.repository: %w", err)
		}
	}
	interval := capstanv1.DefaultPullRequestInterval
	if pr.Interval != nil && pr.Interval.Duration > 0 {
		interval = pr.Interval.Duration
	}
	cfg := forge.Config{Provider: forge.Provider(pr.Provider), BaseURL: pr.BaseURL}
	return &group{
		key: PullRequestGroup(cfg.Provider, cfg.BaseURL, repo, branch), cfg: cfg,
		repo: repo, branch: branch, interval: interval, members: []*capstanv1.ClusterDeployment{cd},
	}, nil
}

// complain logs a configuration problem of a deployment once; "" clears it.
func (w *PullRequests) complain(ctx context.Context, cd *capstanv1.ClusterDeployment, problem string) {
	key := types.NamespacedName{Namespace: cd.Namespace, Name: cd.Name}
	w.mu.Lock()
	same := w.complained[key] == problem
	if problem == "" {
		delete(w.complained, key)
	} else {
		w.complained[key] = problem
	}
	w.mu.Unlock()
	if problem != "" && !same {
		log.FromContext(ctx).Error(errors.New(problem), "pull requests not watched", "namespace", cd.Namespace, "name", cd.Name)
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/reconciler/report/forge"
	"github.com/capstan-dev/capstan/sources/git"
	"github.com/capstan-dev/capstan/stages"
)

// pullRequestPlan plans the head of pull request --pr for the live
// deployment, as the daemon does for its comment: the forge of
// spec.report.pullRequests finds the pull request, the deployment's git
// source and credentials fetch its head.
func (f *diffFlags) pullRequestPlan(ctx context.Context, c client.Client, t diffTarget, errOut io.Writer) (*stages.Plan, error) {
	if t.live == nil || f.deployment == "" {
		return nil, errors.New("--pr needs --deployment NAMESPACE/NAME: the live deployment says which repository, forge and credentials")
	}
	cd := t.live
	src := cd.Spec.Source
	if src == nil || src.Git == nil {
		return nil, fmt.Errorf("--pr: ClusterDeployment %s/%s does not read a git repository of its own (spec.source.git)", cd.Namespace, cd.Name)
	}
	if cd.Spec.Report == nil || cd.Spec.Report.PullRequests == nil {
		return nil, fmt.Errorf("--pr: ClusterDeployment %s/%s has no spec.report.pullRequests: it says which forge holds the pull requests", cd.Namespace, cd.Name)
	}
	prs := cd.Spec.Report.PullRequests
	repo := prs.Repository
	if repo == "" {
		var err error
		if repo, err = forge.RepositoryFromURL(src.Git.URL, prs.BaseURL); err != nil {
			return nil, err
		}
	}
	creds, err := f.forgeCredentials(ctx, c, cd, prs)
	if err != nil {
		return nil, err
	}
	fg, err := forge.New(creds.Apply(forge.Config{Provider: forge.Provider(prs.Provider), BaseURL: prs.BaseURL}))
	if err != nil {
		return nil, err
	}
	branch := src.Git.Ref.Branch
	if branch == "" {
		branch = git.DefaultBranch
	}
	open, err := fg.OpenPullRequests(ctx, repo, branch)
	if err != nil {
		return nil, err
	}
	var pr *forge.PullRequest
	for i := range open {
		if open[i].Number == f.pr {
			pr = &open[i]
		}
	}
	if pr == nil {
		return nil, fmt.Errorf("--pr %d: no open pull request %d against branch %s of %s", f.pr, f.pr, branch, repo)
	}
	in := reconciler.RefFetch{URL: src.Git.URL, Ref: pr.HeadFetchRef}
	if ref := src.Git.SecretRef; ref != nil {
		s := &corev1.Secret{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: cd.Namespace, Name: ref.Name}, s); err != nil {
			return nil, fmt.Errorf("spec.source.git.secretRef: read Secret %s/%s: %w", cd.Namespace, ref.Name, err)
		}
		if in.Auth, err = reconciler.GitAuth(s); err != nil {
			return nil, err
		}
		in.Secret = cd.Namespace + "/" + ref.Name
	}
	art, err := reconciler.FetchRef(ctx, in)
	if err != nil {
		return nil, err
	}
	defer art.Remove()
	fmt.Fprintf(errOut, "pull request #%d %q: %s\n", pr.Number, pr.Title, art.Revision)
	opts, err := f.renderOptions()
	if err != nil {
		return nil, err
	}
	plan, err := reconciler.PlanTree(ctx, reconciler.PlanInput{FS: art.FS, Spec: t.spec, Live: cd, Render: opts})
	return plan, keyHint(err)
}

// forgeCredentials reads the forge token from --token-env, else the token
// and the CA (ca.crt) from the deployment's Secret. With --token-env the
// Secret is not read at all (the user may not be allowed to): the system
// roots are trusted, which SSL_CERT_FILE extends.
func (f *diffFlags) forgeCredentials(ctx context.Context, c client.Client, cd *capstanv1.ClusterDeployment, prs *capstanv1.PullRequestReport) (forge.Credentials, error) {
	secret := types.NamespacedName{Namespace: cd.Namespace, Name: prs.SecretRef.Name}
	if f.tokenEnv == "" {
		return forge.ReadCredentials(ctx, c, secret, capstanv1.DefaultForgeTokenKey)
	}
	token := strings.TrimSpace(os.Getenv(f.tokenEnv))
	if token == "" {
		return forge.Credentials{}, fmt.Errorf("--token-env %s: the variable is empty or not set", f.tokenEnv)
	}
	return forge.Credentials{Token: token}, nil
}

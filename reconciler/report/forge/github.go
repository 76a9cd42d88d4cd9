package forge

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/google/go-github/v84/github"
)

// The permissions a GitHub token needs, per request: fine-grained tokens
// and GitHub Apps name permissions, classic tokens scopes.
const (
	githubScopeRead    = `"Pull requests: read" (classic token: repo, or public_repo for a public repository)`
	githubScopeComment = `"Pull requests: write" (classic token: repo, or public_repo for a public repository)`
	githubScopeStatus  = `"Commit statuses: write" (classic token: repo:status)`
)

// githubPageSize is the largest page GitHub serves.
const githubPageSize = 100

// GitHub is the Forge of github.com or a GitHub Enterprise Server, through
// go-github.
type GitHub struct {
	base
	client *github.Client
}

var _ Forge = (*GitHub)(nil)

// NewGitHub returns the Forge of github.com, or of the GitHub Enterprise
// Server at cfg.BaseURL.
func NewGitHub(cfg Config) (*GitHub, error) {
	if cfg.Token == "" {
		return nil, errors.New("github: a token is required")
	}
	hc, err := httpClient(cfg)
	if err != nil {
		return nil, err
	}
	c := github.NewClient(hc).WithAuthToken(cfg.Token)
	shown := "https://api.github.com"
	if cfg.BaseURL != "" {
		u, perr := url.Parse(cfg.BaseURL)
		if perr != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return nil, fmt.Errorf("github: base URL %q: must be an http(s) URL such as https://github.example.com", cfg.BaseURL)
		}
		// The API of a GitHub Enterprise Server lives under /api/v3/,
		// which WithEnterpriseURLs adds.
		if c, err = c.WithEnterpriseURLs(cfg.BaseURL, cfg.BaseURL); err != nil {
			return nil, fmt.Errorf("github: base URL %q: %w", cfg.BaseURL, err)
		}
		shown = strings.TrimSuffix(c.BaseURL.String(), "/")
	}
	c.UserAgent = "capstan"
	return &GitHub{base: base{provider: ProviderGitHub, baseURL: shown, token: cfg.Token, caFrom: caFrom(cfg.CAFrom)}, client: c}, nil
}

func githubStatus(resp *github.Response) int {
	if resp == nil || resp.Response == nil {
		return 0
	}
	return resp.StatusCode
}

// OpenPullRequests implements Forge.
func (g *GitHub) OpenPullRequests(ctx context.Context, repo, baseBranch string) ([]PullRequest, error) {
	owner, name, err := ownerName(ProviderGitHub, repo)
	if err != nil {
		return nil, err
	}
	opts := &github.PullRequestListOptions{
		State: "open", Base: baseBranch, Sort: "created", Direction: "asc",
		ListOptions: github.ListOptions{PerPage: githubPageSize},
	}
	var out []PullRequest
	for {
		prs, resp, err := g.client.PullRequests.List(ctx, owner, name, opts)
		if err != nil {
			return nil, g.failure("list open pull requests against "+baseBranch, repo, githubStatus(resp), githubScopeRead, err)
		}
		for _, pr := range prs {
			if pr.GetBase().GetRef() != baseBranch {
				continue
			}
			out = append(out, githubPullRequest(pr))
		}
		if resp == nil || resp.NextPage == 0 {
			return out, nil
		}
		opts.Page = resp.NextPage
	}
}

// UpsertComment implements Forge.
func (g *GitHub) UpsertComment(ctx context.Context, repo string, pr int64, key, body string) (Comment, error) {
	owner, name, err := g.commentArgs(repo, key)
	if err != nil {
		return Comment{}, err
	}
	op := fmt.Sprintf("comment on pull request %d", pr)
	want := commentBody(key, body, GitHubCommentLimit)
	cm, resp, err := g.ours(ctx, owner, name, pr, key)
	switch {
	case err != nil:
		return Comment{}, g.failure(op, repo, githubStatus(resp), githubScopeComment, err)
	case cm == nil:
		created, resp, err := g.client.Issues.CreateComment(ctx, owner, name, int(pr), &github.IssueComment{Body: github.Ptr(want)})
		if err != nil {
			return Comment{}, g.failure(op, repo, githubStatus(resp), githubScopeComment, err)
		}
		return Comment{ID: created.GetID(), URL: created.GetHTMLURL(), Action: CommentCreated}, nil
	case sameBody(cm.GetBody(), want):
		return Comment{ID: cm.GetID(), URL: cm.GetHTMLURL(), Action: CommentUnchanged}, nil
	}
	edited, resp, err := g.client.Issues.EditComment(ctx, owner, name, cm.GetID(), &github.IssueComment{Body: github.Ptr(want)})
	if err != nil {
		return Comment{}, g.failure(fmt.Sprintf("edit comment %d on pull request %d", cm.GetID(), pr), repo, githubStatus(resp), githubScopeComment, err)
	}
	return Comment{ID: edited.GetID(), URL: edited.GetHTMLURL(), Action: CommentEdited}, nil
}

// ReadComment implements Forge.
func (g *GitHub) ReadComment(ctx context.Context, repo string, pr int64, key string) (Comment, bool, error) {
	owner, name, err := g.commentArgs(repo, key)
	if err != nil {
		return Comment{}, false, err
	}
	cm, resp, err := g.ours(ctx, owner, name, pr, key)
	if err != nil {
		return Comment{}, false, g.failure(fmt.Sprintf("read the comment on pull request %d", pr), repo, githubStatus(resp), githubScopeRead, err)
	}
	if cm == nil {
		return Comment{}, false, nil
	}
	return readBack(cm.GetID(), cm.GetHTMLURL(), cm.GetBody()), true, nil
}

func (g *GitHub) commentArgs(repo, key string) (string, string, error) {
	owner, name, err := ownerName(ProviderGitHub, repo)
	if err != nil {
		return "", "", err
	}
	return owner, name, checkKey(key)
}

// ours returns the first comment on pull request pr that UpsertComment
// keeps under key, nil when there is none. A pull request's conversation
// comments are its issue's comments on GitHub.
func (g *GitHub) ours(ctx context.Context, owner, name string, pr int64, key string) (*github.IssueComment, *github.Response, error) {
	opts := &github.IssueListCommentsOptions{
		Sort: github.Ptr("created"), Direction: github.Ptr("asc"),
		ListOptions: github.ListOptions{PerPage: githubPageSize},
	}
	for {
		cs, resp, err := g.client.Issues.ListComments(ctx, owner, name, int(pr), opts)
		if err != nil {
			return nil, resp, err
		}
		for _, cm := range cs {
			if isOurs(cm.GetBody(), key) {
				return cm, resp, nil
			}
		}
		if resp == nil || resp.NextPage == 0 {
			return nil, resp, nil
		}
		opts.Page = resp.NextPage
	}
}

// SetCommitStatus implements Forge.
func (g *GitHub) SetCommitStatus(ctx context.Context, repo, sha string, st Status) error {
	owner, name, err := ownerName(ProviderGitHub, repo)
	if err != nil {
		return err
	}
	if err := checkState(st.State); err != nil {
		return err
	}
	status := github.RepoStatus{
		State:       github.Ptr(string(st.State)),
		Description: github.Ptr(statusDescription(st)),
		Context:     github.Ptr(statusContext(st)),
	}
	if st.TargetURL != "" {
		status.TargetURL = github.Ptr(st.TargetURL)
	}
	_, resp, err := g.client.Repositories.CreateStatus(ctx, owner, name, sha, status)
	return g.failure("set commit status "+statusContext(st)+" on commit "+sha, repo, githubStatus(resp), githubScopeStatus, err)
}

func githubPullRequest(pr *github.PullRequest) PullRequest {
	n := int64(pr.GetNumber())
	out := PullRequest{
		Number: n, Title: pr.GetTitle(), HeadSHA: pr.GetHead().GetSHA(), HeadRef: pr.GetHead().GetRef(),
		HeadFetchRef: fmt.Sprintf("refs/pull/%d/head", n), BaseRef: pr.GetBase().GetRef(), URL: pr.GetHTMLURL(),
		Merged: pr.MergedAt != nil || pr.GetMerged(),
		Fork:   githubFork(pr), Author: pr.GetUser().GetLogin(), Association: githubAssociation(pr.GetAuthorAssociation()),
	}
	if out.Merged {
		// Before a merge, merge_commit_sha is GitHub's test merge.
		out.MergeCommitSHA = pr.GetMergeCommitSHA()
	}
	return out
}

// githubFork reports whether pr's head is not a branch of its base
// repository: its head repository is another one, or null (a fork since
// deleted), or either is missing from the answer, which says nothing.
// Repositories are compared by ID, which a rename does not change, and by
// full name where GitHub leaves the ID out.
func githubFork(pr *github.PullRequest) bool {
	head, base := pr.GetHead().GetRepo(), pr.GetBase().GetRepo()
	switch {
	case head == nil || base == nil:
		return true
	case head.GetID() != 0 && base.GetID() != 0:
		return head.GetID() != base.GetID()
	}
	return head.GetFullName() == "" || !strings.EqualFold(head.GetFullName(), base.GetFullName())
}

// PullRequestsForCommit implements Forge: GitHub lists the pull requests
// associated with a commit, merged or open.
func (g *GitHub) PullRequestsForCommit(ctx context.Context, repo, sha string) ([]PullRequest, error) {
	owner, name, err := ownerName(ProviderGitHub, repo)
	if err != nil {
		return nil, err
	}
	opts := &github.ListOptions{PerPage: githubPageSize}
	var out []PullRequest
	for {
		prs, resp, err := g.client.PullRequests.ListPullRequestsWithCommit(ctx, owner, name, sha, opts)
		if err != nil {
			return nil, g.failure("find the pull requests of commit "+sha, repo, githubStatus(resp), githubScopeRead, err)
		}
		for _, pr := range prs {
			out = append(out, githubPullRequest(pr))
		}
		if resp == nil || resp.NextPage == 0 {
			return out, nil
		}
		opts.Page = resp.NextPage
	}
}

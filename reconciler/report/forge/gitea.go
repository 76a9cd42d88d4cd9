package forge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"code.gitea.io/sdk/gitea"
)

// The scopes a Gitea token needs, per request.
const (
	giteaScopeRead    = "read:repository"
	giteaScopeComment = "write:issue"
	// giteaScopeReadComment: write:issue includes it.
	giteaScopeReadComment = "read:issue"
	giteaScopeStatus      = "write:repository"
)

// giteaPageSize is Gitea's default maximum page (MAX_RESPONSE_ITEMS).
const giteaPageSize = 50

// Gitea is the Forge of a Gitea server, through its Go SDK.
type Gitea struct {
	base
	http         *http.Client
	associations *associations
}

var _ Forge = (*Gitea)(nil)

// NewGitea returns the Forge of the Gitea server at cfg.BaseURL.
func NewGitea(cfg Config) (*Gitea, error) {
	if cfg.BaseURL == "" {
		return nil, errors.New("gitea: a base URL is required (the server's root URL, e.g. https://gitea.example.com)")
	}
	if cfg.Token == "" {
		return nil, errors.New("gitea: a token is required")
	}
	hc, err := httpClient(cfg)
	if err != nil {
		return nil, err
	}
	return &Gitea{
		base:         base{provider: ProviderGitea, baseURL: strings.TrimSuffix(cfg.BaseURL, "/"), token: cfg.Token, caFrom: caFrom(cfg.CAFrom)},
		http:         hc,
		associations: newAssociations(),
	}, nil
}

// client returns an SDK client whose requests carry ctx: the SDK keeps
// the context on the client, so each call gets its own (they are cheap:
// the server version check is skipped, Capstan needs no old-server
// workarounds).
func (g *Gitea) client(ctx context.Context) (*gitea.Client, error) {
	c, err := gitea.NewClient(g.baseURL, gitea.SetToken(g.token), gitea.SetHTTPClient(g.http),
		gitea.SetContext(ctx), gitea.SetGiteaVersion(""), gitea.SetUserAgent("capstan"))
	if err != nil {
		return nil, fmt.Errorf("gitea: client for %s: %w", g.baseURL, err)
	}
	return c, nil
}

func giteaStatus(resp *gitea.Response) int {
	if resp == nil || resp.Response == nil {
		return 0
	}
	return resp.StatusCode
}

// OpenPullRequests implements Forge.
func (g *Gitea) OpenPullRequests(ctx context.Context, repo, baseBranch string) ([]PullRequest, error) {
	owner, name, err := ownerName(ProviderGitea, repo)
	if err != nil {
		return nil, err
	}
	c, err := g.client(ctx)
	if err != nil {
		return nil, err
	}
	op := "list open pull requests against " + baseBranch
	var out []PullRequest
	for page := 1; ; page++ {
		prs, resp, err := c.ListRepoPullRequests(owner, name, gitea.ListPullRequestsOptions{
			ListOptions: gitea.ListOptions{Page: page, PageSize: giteaPageSize},
			State:       gitea.StateOpen,
			Sort:        "oldest",
		})
		if err != nil {
			return nil, g.failure(op, repo, giteaStatus(resp), giteaScopeRead, err)
		}
		for _, pr := range prs {
			if pr.Base == nil || pr.Base.Ref != baseBranch || pr.Head == nil {
				continue
			}
			p := giteaPullRequest(pr)
			if p.Fork && p.Author != "" {
				if p.Association, err = g.association(c, owner, name, p.Author); err != nil {
					return nil, err
				}
			}
			out = append(out, p)
		}
		if len(prs) == 0 || resp == nil || resp.NextPage == 0 {
			return out, nil
		}
	}
}

// UpsertComment implements Forge.
func (g *Gitea) UpsertComment(ctx context.Context, repo string, pr int64, key, body string) (Comment, error) {
	c, owner, name, err := g.commentArgs(ctx, repo, key)
	if err != nil {
		return Comment{}, err
	}
	op := fmt.Sprintf("comment on pull request %d", pr)
	want := commentBody(key, body, GiteaCommentLimit)
	cm, resp, err := g.ours(c, owner, name, pr, key)
	switch {
	case err != nil:
		return Comment{}, g.failure(op, repo, giteaStatus(resp), giteaScopeComment, err)
	case cm == nil:
		created, resp, err := c.CreateIssueComment(owner, name, pr, gitea.CreateIssueCommentOption{Body: want})
		if err != nil {
			return Comment{}, g.failure(op, repo, giteaStatus(resp), giteaScopeComment, err)
		}
		return Comment{ID: created.ID, URL: created.HTMLURL, Action: CommentCreated}, nil
	case sameBody(cm.Body, want):
		return Comment{ID: cm.ID, URL: cm.HTMLURL, Action: CommentUnchanged}, nil
	}
	edited, resp, err := c.EditIssueComment(owner, name, cm.ID, gitea.EditIssueCommentOption{Body: want})
	if err != nil {
		return Comment{}, g.failure(fmt.Sprintf("edit comment %d on pull request %d", cm.ID, pr), repo, giteaStatus(resp), giteaScopeComment, err)
	}
	return Comment{ID: edited.ID, URL: edited.HTMLURL, Action: CommentEdited}, nil
}

// ReadComment implements Forge.
func (g *Gitea) ReadComment(ctx context.Context, repo string, pr int64, key string) (Comment, bool, error) {
	c, owner, name, err := g.commentArgs(ctx, repo, key)
	if err != nil {
		return Comment{}, false, err
	}
	cm, resp, err := g.ours(c, owner, name, pr, key)
	if err != nil {
		return Comment{}, false, g.failure(fmt.Sprintf("read the comment on pull request %d", pr), repo, giteaStatus(resp), giteaScopeReadComment, err)
	}
	if cm == nil {
		return Comment{}, false, nil
	}
	return readBack(cm.ID, cm.HTMLURL, cm.Body), true, nil
}

func (g *Gitea) commentArgs(ctx context.Context, repo, key string) (*gitea.Client, string, string, error) {
	owner, name, err := ownerName(ProviderGitea, repo)
	if err != nil {
		return nil, "", "", err
	}
	if err := checkKey(key); err != nil {
		return nil, "", "", err
	}
	c, err := g.client(ctx)
	return c, owner, name, err
}

// ours returns the first comment on pull request pr that UpsertComment
// keeps under key, nil when there is none.
func (g *Gitea) ours(c *gitea.Client, owner, name string, pr int64, key string) (*gitea.Comment, *gitea.Response, error) {
	for page := 1; ; page++ {
		cs, resp, err := c.ListIssueComments(owner, name, pr, gitea.ListIssueCommentOptions{
			ListOptions: gitea.ListOptions{Page: page, PageSize: giteaPageSize},
		})
		if err != nil {
			return nil, resp, err
		}
		for _, cm := range cs {
			if isOurs(cm.Body, key) {
				return cm, resp, nil
			}
		}
		if len(cs) == 0 || resp == nil || resp.NextPage == 0 {
			return nil, resp, nil
		}
	}
}

// SetCommitStatus implements Forge.
func (g *Gitea) SetCommitStatus(ctx context.Context, repo, sha string, st Status) error {
	owner, name, err := ownerName(ProviderGitea, repo)
	if err != nil {
		return err
	}
	if err := checkState(st.State); err != nil {
		return err
	}
	c, err := g.client(ctx)
	if err != nil {
		return err
	}
	_, resp, err := c.CreateStatus(owner, name, sha, gitea.CreateStatusOption{
		State:       gitea.StatusState(st.State),
		TargetURL:   st.TargetURL,
		Description: statusDescription(st),
		Context:     statusContext(st),
	})
	return g.failure("set commit status "+statusContext(st)+" on commit "+sha, repo, giteaStatus(resp), giteaScopeStatus, err)
}

// association looks up what author is to the repository owner/name:
// Gitea does not say with the pull request. Its owner and its
// collaborators count; anyone else has none (members of an organization
// that owns the repository count only as collaborators: asking Gitea about
// an organization's members takes a token scope Capstan does not ask for).
func (g *Gitea) association(c *gitea.Client, owner, name, author string) (Association, error) {
	if strings.EqualFold(author, owner) {
		return AssociationOwner, nil
	}
	return g.associations.lookup(owner+"/"+name, author, func() (Association, error) {
		_, resp, err := c.IsCollaborator(owner, name, author)
		switch status := giteaStatus(resp); {
		case err == nil && status == http.StatusNoContent:
			return AssociationCollaborator, nil
		case err == nil && (status == http.StatusNotFound || status == http.StatusUnprocessableEntity):
			// No collaborator, or no such user any more.
			return "", nil
		case err == nil:
			err = fmt.Errorf("unexpected answer %d", status)
			fallthrough
		default:
			return "", g.failure(fmt.Sprintf("check whether %s, the author of a pull request from a fork, is a collaborator", author),
				owner+"/"+name, status, giteaScopeRead, err)
		}
	})
}

// giteaFork reports whether pr's head is not a branch of its base
// repository: another repository's, one Gitea no longer knows (repo_id
// -1), or an AGit pull request (pushed to refs/for/<branch> by anyone who
// can read the repository), which Gitea gives its base repository as head
// but no branch label.
func giteaFork(pr *gitea.PullRequest) bool {
	head, base := pr.Head, pr.Base
	switch {
	case head == nil || base == nil:
		return true
	case head.Name == "":
		return true
	case head.RepoID <= 0 || base.RepoID <= 0:
		return true
	}
	return head.RepoID != base.RepoID
}

func giteaPullRequest(pr *gitea.PullRequest) PullRequest {
	out := PullRequest{
		Number: pr.Index, Title: pr.Title, HeadFetchRef: fmt.Sprintf("refs/pull/%d/head", pr.Index),
		URL: pr.HTMLURL, Merged: pr.HasMerged, Fork: giteaFork(pr),
	}
	if pr.Poster != nil {
		out.Author = pr.Poster.UserName
	}
	if pr.Head != nil {
		out.HeadSHA, out.HeadRef = pr.Head.Sha, pr.Head.Ref
	}
	if pr.Base != nil {
		out.BaseRef = pr.Base.Ref
	}
	if pr.MergedCommitID != nil {
		out.MergeCommitSHA = *pr.MergedCommitID
	}
	return out
}

// PullRequestsForCommit implements Forge. Gitea answers with the one pull
// request whose merge commit sha is, or 404 when there is none.
func (g *Gitea) PullRequestsForCommit(ctx context.Context, repo, sha string) ([]PullRequest, error) {
	owner, name, err := ownerName(ProviderGitea, repo)
	if err != nil {
		return nil, err
	}
	c, err := g.client(ctx)
	if err != nil {
		return nil, err
	}
	pr, resp, err := c.GetCommitPullRequest(owner, name, sha)
	if giteaStatus(resp) == http.StatusNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, g.failure("find the pull request of commit "+sha, repo, giteaStatus(resp), giteaScopeRead, err)
	}
	return []PullRequest{giteaPullRequest(pr)}, nil
}

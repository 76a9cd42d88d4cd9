package forge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	gitlab "gitlab.com/gitlab-org/api/client-go"
)

// The scope and role a GitLab token needs, per request.
const (
	gitlabScopeRead    = "the read_api scope and the Reporter role on the project"
	gitlabScopeComment = "the api scope and the Reporter role on the project"
	gitlabScopeStatus  = "the api scope and the Developer role on the project"
)

// gitlabPageSize is the largest page GitLab serves.
const gitlabPageSize = 100

// GitLab is the Forge of gitlab.com or a self-managed GitLab, through
// gitlab.com/gitlab-org/api/client-go.
type GitLab struct {
	base
	client       *gitlab.Client
	webURL       string // the server's web root, for links to notes
	associations *associations
}

var _ Forge = (*GitLab)(nil)

// NewGitLab returns the Forge of gitlab.com, or of the GitLab at
// cfg.BaseURL.
func NewGitLab(cfg Config) (*GitLab, error) {
	if cfg.Token == "" {
		return nil, errors.New("gitlab: a token is required")
	}
	hc, err := httpClient(cfg)
	if err != nil {
		return nil, err
	}
	opts := []gitlab.ClientOptionFunc{
		gitlab.WithHTTPClient(hc),
		gitlab.WithUserAgent("capstan"),
		// The reporter retries with backoff and knows when to stop
		// (Error.Retryable); the client's own retries would hide that.
		gitlab.WithoutRetries(),
	}
	if cfg.BaseURL != "" {
		u, err := url.Parse(cfg.BaseURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return nil, fmt.Errorf("gitlab: base URL %q: must be an http(s) URL such as https://gitlab.example.com", cfg.BaseURL)
		}
		// WithBaseURL adds /api/v4 when it is missing.
		opts = append(opts, gitlab.WithBaseURL(cfg.BaseURL))
	}
	c, err := gitlab.NewClient(cfg.Token, opts...)
	if err != nil {
		return nil, fmt.Errorf("gitlab: client for %s: %w", cfg.BaseURL, err)
	}
	api := strings.TrimSuffix(c.BaseURL().String(), "/")
	return &GitLab{
		base:         base{provider: ProviderGitLab, baseURL: api, token: cfg.Token, caFrom: caFrom(cfg.CAFrom)},
		client:       c,
		webURL:       strings.TrimSuffix(api, "/api/v4"),
		associations: newAssociations(),
	}, nil
}

func gitlabStatus(resp *gitlab.Response, err error) int {
	if resp != nil && resp.Response != nil {
		return resp.StatusCode
	}
	if errors.Is(err, gitlab.ErrNotFound) {
		return http.StatusNotFound
	}
	return 0
}

func checkProject(repo string) error {
	if repo == "" || strings.HasPrefix(repo, "/") || strings.HasSuffix(repo, "/") {
		return fmt.Errorf("gitlab project %q: must be the project's path, e.g. group/subgroup/name", repo)
	}
	return nil
}

// OpenPullRequests implements Forge: the open merge requests whose target
// branch is base.
func (g *GitLab) OpenPullRequests(ctx context.Context, repo, baseBranch string) ([]PullRequest, error) {
	if err := checkProject(repo); err != nil {
		return nil, err
	}
	opts := &gitlab.ListProjectMergeRequestsOptions{
		State: gitlab.Ptr("opened"), TargetBranch: gitlab.Ptr(baseBranch),
		OrderBy: gitlab.Ptr("created_at"), Sort: gitlab.Ptr("asc"),
		ListOptions: gitlab.ListOptions{PerPage: gitlabPageSize},
	}
	var out []PullRequest
	for {
		mrs, resp, err := g.client.MergeRequests.ListProjectMergeRequests(repo, opts, gitlab.WithContext(ctx))
		if err != nil {
			return nil, g.failure("list open merge requests against "+baseBranch, repo, gitlabStatus(resp, err), gitlabScopeRead, err)
		}
		for _, mr := range mrs {
			if mr.TargetBranch != baseBranch {
				continue
			}
			pr := gitlabMergeRequest(mr)
			if pr.Fork && mr.Author != nil {
				if pr.Association, err = g.association(ctx, repo, mr.Author); err != nil {
					return nil, err
				}
			}
			out = append(out, pr)
		}
		if resp == nil || resp.NextPage == 0 {
			return out, nil
		}
		opts.Page = resp.NextPage
	}
}

// association looks up what author is to the project: GitLab does not say
// with the merge request. A member (inherited ones included) with the
// Developer role or above may push branches to the project, and counts as
// a member (the Owner role as the owner); a Reporter, a Guest or a user who
// is no member has none.
func (g *GitLab) association(ctx context.Context, repo string, author *gitlab.BasicUser) (Association, error) {
	return g.associations.lookup(repo, strconv.FormatInt(author.ID, 10), func() (Association, error) {
		m, resp, err := g.client.ProjectMembers.GetInheritedProjectMember(repo, author.ID, gitlab.WithContext(ctx))
		switch status := gitlabStatus(resp, err); {
		case status == http.StatusNotFound:
			return "", nil
		case err != nil:
			return "", g.failure(fmt.Sprintf("look up the membership of %s, the author of a merge request from a fork,", author.Username),
				repo, status, gitlabScopeRead, err)
		case m.AccessLevel >= gitlab.OwnerPermissions:
			return AssociationOwner, nil
		case m.AccessLevel >= gitlab.DeveloperPermissions:
			return AssociationMember, nil
		}
		return "", nil
	})
}

// UpsertComment implements Forge with a merge request note.
func (g *GitLab) UpsertComment(ctx context.Context, repo string, mr int64, key, body string) (Comment, error) {
	if err := g.commentArgs(repo, key); err != nil {
		return Comment{}, err
	}
	op := fmt.Sprintf("comment on merge request %d", mr)
	want := commentBody(key, body, GitLabCommentLimit)
	n, resp, err := g.ours(ctx, repo, mr, key)
	switch {
	case err != nil:
		return Comment{}, g.failure(op, repo, gitlabStatus(resp, err), gitlabScopeComment, err)
	case n == nil:
		created, resp, err := g.client.Notes.CreateMergeRequestNote(repo, mr,
			&gitlab.CreateMergeRequestNoteOptions{Body: gitlab.Ptr(want)}, gitlab.WithContext(ctx))
		if err != nil {
			return Comment{}, g.failure(op, repo, gitlabStatus(resp, err), gitlabScopeComment, err)
		}
		return Comment{ID: created.ID, URL: g.noteURL(repo, mr, created.ID), Action: CommentCreated}, nil
	case sameBody(n.Body, want):
		return Comment{ID: n.ID, URL: g.noteURL(repo, mr, n.ID), Action: CommentUnchanged}, nil
	}
	edited, resp, err := g.client.Notes.UpdateMergeRequestNote(repo, mr, n.ID,
		&gitlab.UpdateMergeRequestNoteOptions{Body: gitlab.Ptr(want)}, gitlab.WithContext(ctx))
	if err != nil {
		return Comment{}, g.failure(fmt.Sprintf("edit note %d on merge request %d", n.ID, mr), repo, gitlabStatus(resp, err), gitlabScopeComment, err)
	}
	return Comment{ID: edited.ID, URL: g.noteURL(repo, mr, edited.ID), Action: CommentEdited}, nil
}

// ReadComment implements Forge with a merge request note.
func (g *GitLab) ReadComment(ctx context.Context, repo string, mr int64, key string) (Comment, bool, error) {
	if err := g.commentArgs(repo, key); err != nil {
		return Comment{}, false, err
	}
	n, resp, err := g.ours(ctx, repo, mr, key)
	if err != nil {
		return Comment{}, false, g.failure(fmt.Sprintf("read the note on merge request %d", mr), repo, gitlabStatus(resp, err), gitlabScopeRead, err)
	}
	if n == nil {
		return Comment{}, false, nil
	}
	return readBack(n.ID, g.noteURL(repo, mr, n.ID), n.Body), true, nil
}

func (g *GitLab) commentArgs(repo, key string) error {
	if err := checkProject(repo); err != nil {
		return err
	}
	return checkKey(key)
}

// ours returns the first note on merge request mr that UpsertComment
// keeps under key, nil when there is none. System notes (GitLab's own
// "added 1 commit") are never taken for Capstan's.
func (g *GitLab) ours(ctx context.Context, repo string, mr int64, key string) (*gitlab.Note, *gitlab.Response, error) {
	opts := &gitlab.ListMergeRequestNotesOptions{
		OrderBy: gitlab.Ptr("created_at"), Sort: gitlab.Ptr("asc"),
		ListOptions: gitlab.ListOptions{PerPage: gitlabPageSize},
	}
	for {
		notes, resp, err := g.client.Notes.ListMergeRequestNotes(repo, mr, opts, gitlab.WithContext(ctx))
		if err != nil {
			return nil, resp, err
		}
		for _, n := range notes {
			if !n.System && isOurs(n.Body, key) {
				return n, resp, nil
			}
		}
		if resp == nil || resp.NextPage == 0 {
			return nil, resp, nil
		}
		opts.Page = resp.NextPage
	}
}

// noteURL is the web address of a note; empty for a project given by its
// numeric ID, whose path Capstan does not know.
func (g *GitLab) noteURL(repo string, mr, note int64) string {
	if _, err := strconv.ParseInt(repo, 10, 64); err == nil {
		return ""
	}
	return fmt.Sprintf("%s/%s/-/merge_requests/%d#note_%d", g.webURL, repo, mr, note)
}

// gitlabState maps a State to GitLab's: it has no error state, and a
// rollout in progress is running rather than pending (waiting to start).
func gitlabState(s State) gitlab.BuildStateValue {
	switch s {
	case StatePending:
		return gitlab.Running
	case StateSuccess:
		return gitlab.Success
	}
	return gitlab.Failed
}

// SetCommitStatus implements Forge. GitLab refuses to set a status to the
// state it already has ("Cannot transition status via :run from
// :running"); that answer counts as done, since the state is the one
// wanted (only the description stays as it was).
func (g *GitLab) SetCommitStatus(ctx context.Context, repo, sha string, st Status) error {
	if err := checkProject(repo); err != nil {
		return err
	}
	if err := checkState(st.State); err != nil {
		return err
	}
	opts := &gitlab.SetCommitStatusOptions{
		State:       gitlabState(st.State),
		Name:        gitlab.Ptr(statusContext(st)),
		Description: gitlab.Ptr(statusDescription(st)),
	}
	if st.TargetURL != "" {
		opts.TargetURL = gitlab.Ptr(st.TargetURL)
	}
	_, resp, err := g.client.Commits.SetCommitStatus(repo, sha, opts, gitlab.WithContext(ctx))
	if err != nil && gitlabStatus(resp, err) == http.StatusBadRequest && strings.Contains(err.Error(), "Cannot transition status") {
		return nil
	}
	return g.failure("set commit status "+statusContext(st)+" on commit "+sha, repo, gitlabStatus(resp, err), gitlabScopeStatus, err)
}

func gitlabMergeRequest(mr *gitlab.BasicMergeRequest) PullRequest {
	out := PullRequest{
		Number: mr.IID, Title: mr.Title, HeadSHA: mr.SHA, HeadRef: mr.SourceBranch,
		HeadFetchRef: fmt.Sprintf("refs/merge-requests/%d/head", mr.IID), BaseRef: mr.TargetBranch, URL: mr.WebURL,
		Merged: mr.State == "merged",
		// Another project's branch: a fork's. A project given by its
		// path lists only its own merge requests, so the target is it.
		Fork: mr.SourceProjectID != mr.TargetProjectID,
	}
	if mr.Author != nil {
		out.Author = mr.Author.Username
	}
	if out.Merged {
		out.MergeCommitSHA = mr.MergeCommitSHA
		if out.MergeCommitSHA == "" {
			out.MergeCommitSHA = mr.SquashCommitSHA
		}
	}
	return out
}

// PullRequestsForCommit implements Forge: GitLab lists the merge
// requests a commit belongs to.
func (g *GitLab) PullRequestsForCommit(ctx context.Context, repo, sha string) ([]PullRequest, error) {
	if err := checkProject(repo); err != nil {
		return nil, err
	}
	mrs, resp, err := g.client.Commits.ListMergeRequestsByCommit(repo, sha, gitlab.WithContext(ctx))
	if err != nil {
		return nil, g.failure("find the merge requests of commit "+sha, repo, gitlabStatus(resp, err), gitlabScopeRead, err)
	}
	out := make([]PullRequest, 0, len(mrs))
	for _, mr := range mrs {
		out = append(out, gitlabMergeRequest(mr))
	}
	return out, nil
}

package giteaserver

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"code.gitea.io/sdk/gitea"
)

// Repo names a repository on the server.
type Repo struct {
	Owner string
	Name  string
}

// String is "owner/name", the form the forge providers take.
func (r Repo) String() string { return r.Owner + "/" + r.Name }

// PullRequest is what OpenPullRequest returns.
type PullRequest struct {
	Number  int64
	HeadSHA string
	URL     string
}

// Comment is one comment on a pull request.
type Comment struct {
	ID     int64
	Author string
	Body   string
}

// Status is one commit status.
type Status struct {
	State       string
	Context     string
	Description string
	TargetURL   string
}

// client returns an SDK client acting as the admin user whose requests
// carry ctx (the SDK keeps the context on the client).
func (s *Server) client(ctx context.Context) (*gitea.Client, error) {
	c, err := gitea.NewClient(s.url, gitea.SetToken(s.token), gitea.SetContext(ctx), gitea.SetGiteaVersion(""))
	if err != nil {
		return nil, fmt.Errorf("gitea client: %w", err)
	}
	return c, nil
}

// NewToken creates an access token of the admin user with only the given
// scopes (e.g. "write:repository", "write:issue"), so that a test can check
// which scopes a feature needs.
func (s *Server) NewToken(ctx context.Context, name string, scopes ...string) (string, error) {
	c, err := gitea.NewClient(s.url, gitea.SetBasicAuth(AdminUser, s.password), gitea.SetContext(ctx), gitea.SetGiteaVersion(""))
	if err != nil {
		return "", fmt.Errorf("gitea client: %w", err)
	}
	opt := gitea.CreateAccessTokenOption{Name: name}
	for _, sc := range scopes {
		opt.Scopes = append(opt.Scopes, gitea.AccessTokenScope(sc))
	}
	tok, _, err := c.CreateAccessToken(opt)
	if err != nil {
		return "", fmt.Errorf("create gitea token %s: %w", name, err)
	}
	return tok.Token, nil
}

// CreateRepo creates a repository of the admin user with one commit (a
// README) on main.
func (s *Server) CreateRepo(ctx context.Context, name string) (Repo, error) {
	c, err := s.client(ctx)
	if err != nil {
		return Repo{}, err
	}
	_, _, err = c.CreateRepo(gitea.CreateRepoOption{Name: name, AutoInit: true, Readme: "Default", DefaultBranch: "main"})
	if err != nil {
		return Repo{}, fmt.Errorf("create gitea repository %s: %w", name, err)
	}
	return Repo{Owner: AdminUser, Name: name}, nil
}

// CloneURL is the repository's HTTP URL, without credentials.
func (s *Server) CloneURL(r Repo) string { return s.url + "/" + r.String() + ".git" }

// GitAuthHeader is the HTTP header value that authenticates git over HTTP
// as the admin user (basic auth with the token as password).
func (s *Server) GitAuthHeader() string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(AdminUser+":"+s.token))
}

// Commit writes files (path -> content) on top of branch, or on top of main
// when branch does not exist yet, commits them and pushes the commit to
// branch with the git CLI over HTTP. It returns the commit's SHA.
func (s *Server) Commit(ctx context.Context, r Repo, branch string, files map[string]string, message string) (string, error) {
	work, err := os.MkdirTemp("", "giteaserver-push-")
	if err != nil {
		return "", fmt.Errorf("push to %s: %w", r, err)
	}
	defer os.RemoveAll(work)
	git := func(args ...string) (string, error) { return s.git(ctx, work, args...) }

	if _, err := git("init", "--quiet", "--initial-branch="+branch); err != nil {
		return "", fmt.Errorf("push to %s: %w", r, err)
	}
	if _, err := git("remote", "add", "origin", s.CloneURL(r)); err != nil {
		return "", fmt.Errorf("push to %s: %w", r, err)
	}
	if _, err := git("fetch", "--quiet", "origin", branch); err != nil {
		if _, err := git("fetch", "--quiet", "origin", "main"); err != nil {
			return "", fmt.Errorf("push to %s: fetch %s and main: %w", r, branch, err)
		}
	}
	if _, err := git("reset", "--quiet", "--hard", "FETCH_HEAD"); err != nil {
		return "", fmt.Errorf("push to %s: %w", r, err)
	}
	for p, content := range files {
		full := filepath.Join(work, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return "", fmt.Errorf("push to %s: %w", r, err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			return "", fmt.Errorf("push to %s: %w", r, err)
		}
	}
	if _, err := git("add", "--all"); err != nil {
		return "", fmt.Errorf("push to %s: %w", r, err)
	}
	if _, err := git("commit", "--quiet", "--allow-empty", "-m", message); err != nil {
		return "", fmt.Errorf("push to %s: %w", r, err)
	}
	if _, err := git("push", "--quiet", "origin", "HEAD:refs/heads/"+branch); err != nil {
		return "", fmt.Errorf("push to %s branch %s: %w", r, branch, err)
	}
	sha, err := git("rev-parse", "HEAD")
	if err != nil {
		return "", fmt.Errorf("push to %s: %w", r, err)
	}
	return strings.TrimSpace(sha), nil
}

// git runs the git CLI in dir. The token travels in an extra header set
// through the environment, so it is neither in the remote URL nor in the
// command line, and so in no error message.
func (s *Server) git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = []string{
		"HOME=" + dir, "PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=Capstan Test", "GIT_AUTHOR_EMAIL=test@capstan.invalid",
		"GIT_COMMITTER_NAME=Capstan Test", "GIT_COMMITTER_EMAIL=test@capstan.invalid",
		"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=http.extraHeader",
		"GIT_CONFIG_VALUE_0=Authorization: " + s.GitAuthHeader(),
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(errOut.String()))
	}
	return out.String(), nil
}

// OpenPullRequest opens a pull request from head into base.
func (s *Server) OpenPullRequest(ctx context.Context, r Repo, head, base, title string) (PullRequest, error) {
	c, err := s.client(ctx)
	if err != nil {
		return PullRequest{}, err
	}
	pr, _, err := c.CreatePullRequest(r.Owner, r.Name, gitea.CreatePullRequestOption{Head: head, Base: base, Title: title})
	if err != nil {
		return PullRequest{}, fmt.Errorf("open a pull request %s -> %s in %s: %w", head, base, r, err)
	}
	out := PullRequest{Number: pr.Index, URL: pr.HTMLURL}
	if pr.Head != nil {
		out.HeadSHA = pr.Head.Sha
	}
	return out, nil
}

// MergePullRequest merges pull request n with a merge commit, once Gitea
// has finished checking that it can (it does so in the background after a
// push), and returns the merge commit's SHA.
func (s *Server) MergePullRequest(ctx context.Context, r Repo, n int64) (string, error) {
	c, err := s.client(ctx)
	if err != nil {
		return "", err
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		pr, _, err := c.GetPullRequest(r.Owner, r.Name, n)
		if err != nil {
			return "", fmt.Errorf("merge pull request %d of %s: %w", n, r, err)
		}
		if pr.HasMerged && pr.MergedCommitID != nil {
			return *pr.MergedCommitID, nil
		}
		if pr.Mergeable {
			ok, resp, err := c.MergePullRequest(r.Owner, r.Name, n, gitea.MergePullRequestOption{Style: gitea.MergeStyleMerge})
			// 405 while Gitea is still checking: try again.
			if err != nil && (resp == nil || resp.StatusCode != http.StatusMethodNotAllowed) {
				return "", fmt.Errorf("merge pull request %d of %s: %w", n, r, err)
			}
			_ = ok
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("merge pull request %d of %s: %w", n, r, ctx.Err())
		case <-tick.C:
		}
	}
}

// Comments lists the comments on pull request n, oldest first.
func (s *Server) Comments(ctx context.Context, r Repo, n int64) ([]Comment, error) {
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	var out []Comment
	for page := 1; ; page++ {
		cs, resp, err := c.ListIssueComments(r.Owner, r.Name, n, gitea.ListIssueCommentOptions{ListOptions: gitea.ListOptions{Page: page, PageSize: 50}})
		if err != nil {
			return nil, fmt.Errorf("list comments of pull request %d of %s: %w", n, r, err)
		}
		for _, cm := range cs {
			cc := Comment{ID: cm.ID, Body: cm.Body}
			if cm.Poster != nil {
				cc.Author = cm.Poster.UserName
			}
			out = append(out, cc)
		}
		if resp == nil || resp.NextPage == 0 || len(cs) == 0 {
			return out, nil
		}
	}
}

// CommitStatuses lists the statuses of commit sha, newest first.
func (s *Server) CommitStatuses(ctx context.Context, r Repo, sha string) ([]Status, error) {
	c, err := s.client(ctx)
	if err != nil {
		return nil, err
	}
	sts, _, err := c.ListStatuses(r.Owner, r.Name, sha, gitea.ListStatusesOption{ListOptions: gitea.ListOptions{PageSize: 50}})
	if err != nil {
		return nil, fmt.Errorf("list statuses of %s in %s: %w", sha, r, err)
	}
	slices.SortFunc(sts, func(a, b *gitea.Status) int { return cmp.Compare(b.ID, a.ID) })
	out := make([]Status, 0, len(sts))
	for _, st := range sts {
		out = append(out, Status{State: string(st.State), Context: st.Context, Description: st.Description, TargetURL: st.TargetURL})
	}
	return out, nil
}

// AddPushWebhook registers a Gitea webhook that POSTs push events as JSON
// to url, signed with secret (the X-Gitea-Signature header, HMAC-SHA256).
func (s *Server) AddPushWebhook(ctx context.Context, r Repo, url, secret string) error {
	if url == "" {
		return errors.New("add push webhook: empty URL")
	}
	c, err := s.client(ctx)
	if err != nil {
		return err
	}
	_, _, err = c.CreateRepoHook(r.Owner, r.Name, gitea.CreateHookOption{
		Type:   gitea.HookTypeGitea,
		Config: map[string]string{"url": url, "content_type": "json", "secret": secret},
		Events: []string{"push"},
		Active: true,
	})
	if err != nil {
		return fmt.Errorf("add push webhook to %s: %w", r, err)
	}
	return nil
}

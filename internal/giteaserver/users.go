package giteaserver

import (
	"context"
	"fmt"
	"net/http"

	"code.gitea.io/sdk/gitea"
)

// CreateUser creates a user who is no admin and has no access to the
// admin's repositories beyond what anyone has: a stranger, for pull
// requests from forks. The admin acts as the user (sudo) in ForkAs and
// OpenPullRequestAs.
func (s *Server) CreateUser(ctx context.Context, name string) error {
	c, err := s.client(ctx)
	if err != nil {
		return err
	}
	no := false
	_, _, err = c.AdminCreateUser(gitea.CreateUserOption{
		Username: name, Email: name + "@capstan.invalid", Password: randomHex(16), MustChangePassword: &no,
	})
	if err != nil {
		return fmt.Errorf("create gitea user %s: %w", name, err)
	}
	return nil
}

// sudo returns an SDK client of the admin acting as user.
func (s *Server) sudo(ctx context.Context, user string) (*gitea.Client, error) {
	c, err := gitea.NewClient(s.url, gitea.SetToken(s.token), gitea.SetContext(ctx), gitea.SetGiteaVersion(""), gitea.SetSudo(user))
	if err != nil {
		return nil, fmt.Errorf("gitea client: %w", err)
	}
	return c, nil
}

// ForkAs forks r into user's account, as user, and returns the fork. The
// admin can push to it with Commit.
func (s *Server) ForkAs(ctx context.Context, user string, r Repo) (Repo, error) {
	c, err := s.sudo(ctx, user)
	if err != nil {
		return Repo{}, err
	}
	fork, _, err := c.CreateFork(r.Owner, r.Name, gitea.CreateForkOption{})
	if err != nil {
		return Repo{}, fmt.Errorf("fork %s as %s: %w", r, user, err)
	}
	return Repo{Owner: fork.Owner.UserName, Name: fork.Name}, nil
}

// OpenPullRequestAs opens a pull request into base of r as user; head is
// "owner:branch" for a branch of a fork.
func (s *Server) OpenPullRequestAs(ctx context.Context, user string, r Repo, head, base, title string) (PullRequest, error) {
	c, err := s.sudo(ctx, user)
	if err != nil {
		return PullRequest{}, err
	}
	pr, _, err := c.CreatePullRequest(r.Owner, r.Name, gitea.CreatePullRequestOption{Head: head, Base: base, Title: title})
	if err != nil {
		return PullRequest{}, fmt.Errorf("open a pull request %s -> %s in %s as %s: %w", head, base, r, user, err)
	}
	out := PullRequest{Number: pr.Index, URL: pr.HTMLURL}
	if pr.Head != nil {
		out.HeadSHA = pr.Head.Sha
	}
	return out, nil
}

// AddCollaborator makes user a collaborator of r with write access.
func (s *Server) AddCollaborator(ctx context.Context, r Repo, user string) error {
	c, err := s.client(ctx)
	if err != nil {
		return err
	}
	write := gitea.AccessModeWrite
	resp, err := c.AddCollaborator(r.Owner, r.Name, user, gitea.AddCollaboratorOption{Permission: &write})
	if err != nil {
		return fmt.Errorf("add %s as a collaborator of %s: %w", user, r, err)
	}
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("add %s as a collaborator of %s: answer %d", user, r, resp.StatusCode)
	}
	return nil
}

package forge

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/sources"
)

// Forge is what Capstan needs from a forge. Implementations are safe for
// concurrent use; repo is "owner/name" (GitLab: the project's full path,
// "group/subgroup/name").
type Forge interface {
	// OpenPullRequests lists the open pull requests (GitLab: merge
	// requests) whose target is branch base, oldest first, each saying
	// whether it comes from a fork and what its author is to the
	// repository (Gitea and GitLab: one lookup per fork author, kept a
	// while).
	OpenPullRequests(ctx context.Context, repo, base string) ([]PullRequest, error)
	// UpsertComment keeps one comment on pull request pr that starts with
	// the hidden marker Marker(key): the first such comment is edited to
	// hold body (not at all when it already does), and one is created only
	// when there is none. A body longer than the forge takes is cut, with
	// a note saying so.
	UpsertComment(ctx context.Context, repo string, pr int64, key, body string) (Comment, error)
	// ReadComment returns the comment UpsertComment keeps on pull request
	// pr under key, found by the same lookup: Body is its text without the
	// marker line and with "\n" line ends, as the forge holds it (cut, with
	// the note, when it was too long). found is false when there is none,
	// which is not an error. It lets a replica that did not write the
	// comment (a restart, a sharding takeover) take back what it held.
	ReadComment(ctx context.Context, repo string, pr int64, key string) (c Comment, found bool, err error)
	// SetCommitStatus sets the status named st.Context on commit sha.
	SetCommitStatus(ctx context.Context, repo, sha string, st Status) error
	// PullRequestsForCommit lists the pull requests commit sha came
	// from: the merged one whose merge commit it is, and those whose head
	// it is (a fast-forward or rebase merge). None is not an error.
	PullRequestsForCommit(ctx context.Context, repo, sha string) ([]PullRequest, error)
}

// PullRequest is an open pull request (GitLab: merge request).
type PullRequest struct {
	// Number is the number people see (GitLab: the merge request's iid).
	Number int64
	// Title of the pull request.
	Title string
	// HeadSHA is the commit at the head of the pull request.
	HeadSHA string
	// HeadRef is the branch the changes come from; it may belong to a
	// fork, so fetch HeadFetchRef from the base repository instead.
	HeadRef string
	// HeadFetchRef is the ref of the base repository that holds the head
	// commit, forks included: refs/pull/N/head (GitHub, Gitea) or
	// refs/merge-requests/N/head (GitLab).
	HeadFetchRef string
	// BaseRef is the branch the pull request would be merged into.
	BaseRef string
	// URL is the pull request's web page.
	URL string
	// Merged is true once the pull request is merged.
	Merged bool
	// MergeCommitSHA is the commit the merge made on the base branch
	// (GitLab: the merge or squash commit); empty until it is merged.
	MergeCommitSHA string
	// Fork is true when the head is not a branch of the base repository,
	// so that whoever opened the pull request needed no write access to
	// it: a branch of a fork, of a fork since deleted (GitHub reports its
	// repository as null, Gitea as -1), or, on Gitea, a pull request
	// pushed with AGit (refs/for/<branch>), which anyone who can read the
	// repository may open.
	Fork bool
	// Author is the login (GitLab: the username) of the pull request's
	// author.
	Author string
	// Association is what the author is to the base repository, as the
	// forge says. GitHub reports it with every pull request; Gitea and
	// GitLab do not, and it is looked up for forks alone (empty for a
	// branch of the repository).
	Association Association
}

// CameFrom reports whether commit sha is what pull request pr brought to
// its base branch: its merge commit, or its head when the forge merged
// it without one.
func (pr PullRequest) CameFrom(sha string) bool {
	return sha != "" && (pr.MergeCommitSHA == sha || pr.HeadSHA == sha)
}

// Comment is the comment UpsertComment left or ReadComment found.
type Comment struct {
	// ID is the forge's ID of the comment (GitLab: the note's ID).
	ID int64
	// URL is the comment's web address.
	URL string
	// Action is what UpsertComment did; empty from ReadComment.
	Action CommentAction
	// Body is the comment's text without the marker line (ReadComment
	// only).
	Body string
}

// CommentAction is what UpsertComment did to the comment.
type CommentAction string

// Comment actions.
const (
	CommentCreated   CommentAction = "created"
	CommentEdited    CommentAction = "edited"
	CommentUnchanged CommentAction = "unchanged"
)

// State is a commit status's state. GitLab has no error state: both
// StateFailure and StateError become failed there, and StatePending becomes
// running, since Capstan sets a status only once a rollout has begun.
type State string

// Commit status states.
const (
	StatePending State = "pending"
	StateSuccess State = "success"
	StateFailure State = "failure"
	StateError   State = "error"
)

// Status is a commit status.
type Status struct {
	// State is pending while the rollout runs, success when Ready,
	// failure when it is stuck or stalled, error when Capstan could not
	// tell.
	State State
	// Context names the status, so that later ones replace it (GitLab:
	// the status's name). Empty means DefaultStatusContext.
	Context string
	// Description is one line; longer ones are cut to
	// MaxStatusDescription characters.
	Description string
	// TargetURL is where the status links to (the PR comment, a
	// dashboard); empty links nowhere.
	TargetURL string
}

// DefaultStatusContext is the context of a Status that names none.
const DefaultStatusContext = "capstan"

// MaxStatusDescription is the longest status description sent: GitHub
// takes 140 characters, and the others show about as much.
const MaxStatusDescription = 140

// Provider names a forge.
type Provider string

// Providers.
const (
	ProviderGitHub Provider = "github"
	ProviderGitea  Provider = "gitea"
	ProviderGitLab Provider = "gitlab"
)

// Config configures New.
type Config struct {
	// Provider is the kind of forge.
	Provider Provider
	// BaseURL is the forge's address: empty means github.com or
	// gitlab.com (Gitea has no default). A GitHub Enterprise server is
	// given as https://host (the /api/v3/ path is added), a GitLab
	// server as https://host (the /api/v4 path is added), a Gitea server
	// as its root URL.
	BaseURL string
	// Token authenticates every request (a personal, project, app or bot
	// token; docs/forges.md lists the scopes each forge needs).
	Token string
	// CABundle is PEM certificates of CAs to trust for the forge's https
	// on top of the system roots (the ca.crt key of the token Secret,
	// ReadCredentials). There is no option to skip verification: a
	// private CA goes here.
	CABundle []byte
	// CAFrom names where CABundle is set, for the hint of an untrusted
	// certificate; empty names ca.crt of spec.report.pullRequests.secretRef.
	CAFrom string
	// HTTPClient makes the requests; nil means a client with a
	// 30-second timeout that trusts CABundle. A client given here is used
	// as it is.
	HTTPClient *http.Client
}

// New returns the Forge cfg names.
func New(cfg Config) (Forge, error) {
	switch cfg.Provider {
	case ProviderGitHub:
		return NewGitHub(cfg)
	case ProviderGitea:
		return NewGitea(cfg)
	case ProviderGitLab:
		return NewGitLab(cfg)
	}
	return nil, fmt.Errorf("forge provider %q: must be one of github, gitea, gitlab", cfg.Provider)
}

// httpClient returns cfg.HTTPClient, or a client with a timeout that
// trusts cfg.CABundle beside the system roots.
func httpClient(cfg Config) (*http.Client, error) {
	if cfg.HTTPClient != nil {
		return cfg.HTTPClient, nil
	}
	if len(cfg.CABundle) == 0 {
		// Go's default transport: its idle connections are shared.
		return &http.Client{Timeout: 30 * time.Second}, nil
	}
	t, err := sources.HTTPTransport(cfg.CABundle)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", cfg.Provider, caFrom(cfg.CAFrom), err)
	}
	return &http.Client{Transport: t, Timeout: 30 * time.Second}, nil
}

func caFrom(from string) string {
	if from == "" {
		return sources.CAKeyOf("spec.report.pullRequests.secretRef", "")
	}
	return from
}

// markerKey is what a marker key may hold: it ends up inside an HTML
// comment, so it must not be able to close it.
var markerKey = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/:-]{0,199}$`)

// Marker returns the hidden first line of the comments UpsertComment keeps
// under key: an HTML comment, which forges do not show.
func Marker(key string) string { return "<!-- capstan:" + key + " -->" }

func checkKey(key string) error {
	if !markerKey.MatchString(key) {
		return fmt.Errorf("comment marker key %q: must be 1-200 letters, digits and . _ / : -, starting with a letter or digit", key)
	}
	return nil
}

// commentBody is the full text of a comment: the marker line, then body,
// cut to limit bytes.
func commentBody(key, body string, limit int) string {
	return truncate(Marker(key)+"\n"+body, limit)
}

// isOurs reports whether a comment's text is one UpsertComment keeps under
// key. Only a comment that starts with the marker counts, so that someone
// quoting the comment does not become its owner.
func isOurs(text, key string) bool {
	m := Marker(key)
	return text == m || strings.HasPrefix(text, m+"\n") || strings.HasPrefix(text, m+"\r\n")
}

// readBack is the Comment ReadComment returns for a comment with text.
func readBack(id int64, url, text string) Comment {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	_, body, _ := strings.Cut(text, "\n")
	return Comment{ID: id, URL: url, Body: body}
}

// sameBody reports whether the comment already holds want (forges may
// normalise line endings).
func sameBody(have, want string) bool {
	return strings.ReplaceAll(have, "\r\n", "\n") == want
}

func statusContext(st Status) string {
	if st.Context == "" {
		return DefaultStatusContext
	}
	return st.Context
}

func statusDescription(st Status) string {
	d := strings.Join(strings.Fields(st.Description), " ")
	return cutRunes(d, MaxStatusDescription)
}

func checkState(s State) error {
	switch s {
	case StatePending, StateSuccess, StateFailure, StateError:
		return nil
	}
	return fmt.Errorf("commit status state %q: must be pending, success, failure or error", s)
}

// ownerName splits "owner/name" (GitHub, Gitea).
func ownerName(forge Provider, repo string) (string, string, error) {
	owner, name, ok := strings.Cut(repo, "/")
	if !ok || owner == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%s repository %q: must be owner/name", forge, repo)
	}
	return owner, strings.TrimSuffix(name, ".git"), nil
}

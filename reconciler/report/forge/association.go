package forge

import (
	"strings"
	"sync"
	"time"
)

// Association is what the author of a pull request is to its base
// repository, as far as the forge says. Only the associations that let
// someone push to the repository, or run it, are named: anyone else (a
// first-time contributor, a stranger, an author the forge says nothing of)
// has none, the empty Association.
type Association string

// Associations that make an author trusted (PullRequest.TrustedAuthor).
const (
	// AssociationOwner: the author owns the repository (GitHub OWNER;
	// GitLab Owner role; Gitea: the repository's owner).
	AssociationOwner Association = "owner"
	// AssociationMember: the author is a member of the organization that
	// owns the repository (GitHub MEMBER), or a project member with the
	// Developer role or above (GitLab: may push branches).
	AssociationMember Association = "member"
	// AssociationCollaborator: the author was made a collaborator of the
	// repository (GitHub COLLABORATOR; Gitea collaborator).
	AssociationCollaborator Association = "collaborator"
)

// TrustedAuthor reports whether the forge names the author of pr as the
// base repository's owner, a member or a collaborator: someone who could
// have pushed the branch to the repository itself.
func (pr PullRequest) TrustedAuthor() bool { return pr.Association != "" }

// githubAssociation maps GitHub's author_association; the others
// (CONTRIBUTOR, FIRST_TIME_CONTRIBUTOR, FIRST_TIMER, MANNEQUIN, NONE) grant
// nothing.
func githubAssociation(s string) Association {
	switch strings.ToUpper(s) {
	case "OWNER":
		return AssociationOwner
	case "MEMBER":
		return AssociationMember
	case "COLLABORATOR":
		return AssociationCollaborator
	}
	return ""
}

// associationTTL is how long a looked-up association is reused: Gitea
// and GitLab do not report it with the pull request, and a listing every
// interval must not ask again for every author every time.
const associationTTL = 5 * time.Minute

// associations caches the associations looked up, by repository and
// author. It is safe for concurrent use.
type associations struct {
	now func() time.Time

	mu   sync.Mutex
	seen map[string]association
}

type association struct {
	is Association
	at time.Time
}

func newAssociations() *associations {
	return &associations{now: time.Now, seen: map[string]association{}}
}

// lookup returns the association of author with repo, asking find when
// none younger than associationTTL is known. An error is not cached.
func (a *associations) lookup(repo, author string, find func() (Association, error)) (Association, error) {
	key := repo + "\x00" + strings.ToLower(author)
	now := a.now()
	a.mu.Lock()
	got, ok := a.seen[key]
	a.mu.Unlock()
	if ok && now.Sub(got.at) < associationTTL {
		return got.is, nil
	}
	is, err := find()
	if err != nil {
		return "", err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.seen) >= maxAssociations {
		clear(a.seen)
	}
	a.seen[key] = association{is: is, at: now}
	return is, nil
}

// maxAssociations bounds the cache: past it, it starts again.
const maxAssociations = 1024

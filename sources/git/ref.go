package git

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
	"github.com/go-git/go-git/v5/plumbing"

	"github.com/capstan-dev/capstan/sources"
)

// Ref selects what of a repository a Source follows. At most one field
// may be set; none means Branch DefaultBranch.
type Ref struct {
	// Branch follows the tip of a branch, e.g. "main".
	Branch string
	// Tag follows one tag, e.g. "v1.2.3"; if the tag is moved, the
	// Source moves with it.
	Tag string
	// SemVer follows the highest tag that is a semantic version within
	// this range, e.g. ">=1.2.0 <2.0.0" or "~1.4". Tags that are not
	// versions are ignored; pre-releases count only when the range names
	// one, as for OCI sources.
	SemVer string
	// Commit pins one commit by its full 40-digit SHA-1: the Source never
	// moves, and after the first fetch it never asks the remote again.
	Commit string
	// Name follows any ref by its full name, e.g. "refs/pull/7/head" or
	// "refs/tags/v1".
	Name string
}

// refKind says which field of a Ref is followed.
type refKind int

const (
	refBranch refKind = iota
	refTag
	refSemVer
	refCommit
	refName
)

// fields are the spec field names of each kind, for messages.
var refFields = [...]string{
	refBranch: "ref.branch",
	refTag:    "ref.tag",
	refSemVer: "ref.semver",
	refCommit: "ref.commit",
	refName:   "ref.name",
}

// followedRef is a checked Ref: one kind and its value.
type followedRef struct {
	kind       refKind
	value      string
	constraint *semver.Constraints // for refSemVer
}

// fullSHA1 is what ref.commit must be: short SHAs are ambiguous, and the
// remote cannot be asked to expand one.
var fullSHA1 = regexp.MustCompile(`^[0-9a-f]{40}$`)

// parseRef checks r and returns what it follows. Its errors wrap
// sources.ErrInvalid and name the field at fault.
func parseRef(r Ref) (followedRef, error) {
	var set []followedRef
	for kind, v := range map[refKind]string{refBranch: r.Branch, refTag: r.Tag, refSemVer: r.SemVer, refCommit: r.Commit, refName: r.Name} {
		if v != "" {
			set = append(set, followedRef{kind: kind, value: v})
		}
	}
	if len(set) > 1 {
		return followedRef{}, fmt.Errorf("%w: set only one of ref.branch, ref.tag, ref.semver, ref.commit and ref.name", sources.ErrInvalid)
	}
	if len(set) == 0 {
		return followedRef{kind: refBranch, value: DefaultBranch}, nil
	}
	f := set[0]
	switch f.kind {
	case refBranch:
		if strings.HasPrefix(f.value, "refs/") || !validRefName(plumbing.NewBranchReferenceName(f.value)) {
			return f, fmt.Errorf("%w: ref.branch %q must be a plain branch name such as main (a full ref goes in ref.name)", sources.ErrInvalid, f.value)
		}
	case refTag:
		if strings.HasPrefix(f.value, "refs/") || !validRefName(plumbing.NewTagReferenceName(f.value)) {
			return f, fmt.Errorf("%w: ref.tag %q must be a plain tag name such as v1.2.3 (a full ref goes in ref.name)", sources.ErrInvalid, f.value)
		}
	case refSemVer:
		c, err := semver.NewConstraint(f.value)
		if err != nil {
			return f, fmt.Errorf("%w: ref.semver %q is not a semver range: %w", sources.ErrInvalid, f.value, err)
		}
		f.constraint = c
	case refCommit:
		if !fullSHA1.MatchString(f.value) {
			return f, fmt.Errorf("%w: ref.commit %q is not a full commit SHA (40 lower-case hex digits); short SHAs are not accepted", sources.ErrInvalid, f.value)
		}
	case refName:
		if !strings.HasPrefix(f.value, "refs/") || !validRefName(plumbing.ReferenceName(f.value)) {
			return f, fmt.Errorf("%w: ref.name %q must be a full ref name such as refs/pull/7/head or refs/tags/v1", sources.ErrInvalid, f.value)
		}
	}
	return f, nil
}

// validRefName applies git's rules for ref names (git check-ref-format).
func validRefName(n plumbing.ReferenceName) bool {
	return n.Validate() == nil && !strings.ContainsAny(string(n), " ~^:?*[\\")
}

// String says what is followed, for messages: "branch main", "tag v1",
// "semver >=1.0.0", "commit 4f2c...", "ref refs/pull/7/head".
func (f followedRef) String() string {
	switch f.kind {
	case refTag:
		return "tag " + f.value
	case refSemVer:
		return "semver " + f.value
	case refCommit:
		return "commit " + f.value
	case refName:
		return "ref " + f.value
	default:
		return "branch " + f.value
	}
}

// field is the spec field that sets f, for hints.
func (f followedRef) field() string { return "spec.source.git." + refFields[f.kind] }

// refName is the remote ref f names; empty for a semver range (it names
// a tag only once the tags are listed) and a commit.
func (f followedRef) refName() plumbing.ReferenceName {
	switch f.kind {
	case refBranch:
		return plumbing.NewBranchReferenceName(f.value)
	case refTag:
		return plumbing.NewTagReferenceName(f.value)
	case refName:
		return plumbing.ReferenceName(f.value)
	default:
		return ""
	}
}

// label is what a revision of ref shows before "@sha1:": the branch or
// tag name, or the full ref name.
func (f followedRef) label(ref plumbing.ReferenceName) string {
	switch f.kind {
	case refBranch, refTag, refSemVer:
		return ref.Short()
	default:
		return ref.String()
	}
}

// target is a ref of the remote resolved to the commit it points at.
type target struct {
	ref    plumbing.ReferenceName // on the remote; empty for a pinned commit
	label  string                 // shown in the revision; empty for a pinned commit
	commit plumbing.Hash
}

// revision formats a revision the way every Capstan status shows it:
// "<branch|tag|ref>@sha1:<hash>", or "sha1:<hash>" for a pinned commit.
func (t target) revision() string {
	if t.label == "" {
		return "sha1:" + t.commit.String()
	}
	return revision(t.label, t.commit)
}

// resolve picks what s follows out of an advertisement (an ls-remote
// listing with peeled tags appended as "<name>^{}"). An annotated tag
// resolves to the commit it points at.
func (s *Source) resolve(op string, refs []*plumbing.Reference) (target, error) {
	hashes := make(map[plumbing.ReferenceName]plumbing.Hash, len(refs))
	for _, r := range refs {
		if r.Type() == plumbing.HashReference {
			hashes[r.Name()] = r.Hash()
		}
	}
	commitOf := func(n plumbing.ReferenceName) (plumbing.Hash, bool) {
		if h, ok := hashes[n+"^{}"]; ok {
			return h, true
		}
		h, ok := hashes[n]
		return h, ok
	}
	switch s.ref.kind {
	case refCommit:
		return target{commit: plumbing.NewHash(s.ref.value)}, nil
	case refSemVer:
		var tags []string
		for n := range hashes {
			if n.IsTag() && !strings.HasSuffix(string(n), "^{}") {
				tags = append(tags, n.Short())
			}
		}
		tag, ok := sources.HighestVersion(tags, s.ref.constraint)
		if !ok {
			return target{}, s.newError(op, sources.ErrNotFound,
				fmt.Sprintf("no tag is a semantic version within %q (the repository has %d tags): push one or change %s",
					s.ref.value, len(tags), s.ref.field()), nil)
		}
		n := plumbing.NewTagReferenceName(tag)
		h, _ := commitOf(n)
		return target{ref: n, label: tag, commit: h}, nil
	default:
		n := s.ref.refName()
		if h, ok := commitOf(n); ok {
			return target{ref: n, label: s.ref.label(n), commit: h}, nil
		}
		var near []string
		for r := range hashes {
			switch {
			case s.ref.kind == refBranch && r.IsBranch(),
				s.ref.kind == refTag && r.IsTag() && !strings.HasSuffix(string(r), "^{}"):
				near = append(near, r.Short())
			}
		}
		slices.Sort(near)
		return target{}, s.refNotFound(op, near)
	}
}

// refNotFound is the error for a branch, tag or ref the remote does not
// have; near lists (some of) the branches or tags it does have.
func (s *Source) refNotFound(op string, near []string) error {
	var hint string
	switch s.ref.kind {
	case refCommit:
		hint = "commit " + s.ref.value + " is not in the repository (or no branch or tag reaches it): check " + s.ref.field()
	case refSemVer:
		hint = fmt.Sprintf("no tag is a semantic version within %q: push one or change %s", s.ref.value, s.ref.field())
	case refName:
		hint = "ref " + s.ref.value + " does not exist on the remote: check " + s.ref.field()
	default:
		hint = s.ref.String() + " does not exist on the remote: check " + s.ref.field() + " or push it"
	}
	if len(near) > 0 {
		const show = 10
		more := ""
		if len(near) > show {
			more = fmt.Sprintf(" and %d more", len(near)-show)
			near = near[:show]
		}
		hint += " (it has " + strings.Join(near, ", ") + more + ")"
	}
	return s.newError(op, sources.ErrNotFound, hint, nil)
}

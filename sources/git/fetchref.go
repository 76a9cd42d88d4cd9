package git

import (
	"context"
	"errors"
	"fmt"
	"strings"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/capstan-dev/capstan/sources"
)

// pinnedRef is where a commit fetched by its SHA is kept in the temporary
// repository.
const pinnedRef = plumbing.ReferenceName("refs/capstan/pinned")

// fetchTarget says what Fetch asks for. Only a semver range needs the
// remote for that: its tag is known once the tags are listed.
func (s *Source) fetchTarget(ctx context.Context) (target, error) {
	switch s.ref.kind {
	case refCommit:
		return target{commit: plumbing.NewHash(s.ref.value)}, nil
	case refSemVer:
		refs, err := s.listRefs(ctx)
		if err != nil {
			return target{}, s.classify("fetch", err)
		}
		return s.resolve("fetch", refs)
	default:
		n := s.ref.refName()
		return target{ref: n, label: s.ref.label(n)}, nil
	}
}

// fetchInto fetches t into st and returns its commit: the ref alone at
// depth 1, or the pinned commit.
func (s *Source) fetchInto(ctx context.Context, st *checkedStorage, t target) (*object.Commit, error) {
	if t.ref == "" {
		return s.fetchCommit(ctx, st, t.commit)
	}
	spec := config.RefSpec("+" + t.ref.String() + ":" + t.ref.String())
	if err := s.fetchRefSpecs(ctx, st, 1, spec); err != nil {
		return nil, err
	}
	ref, err := st.Reference(t.ref)
	if err != nil {
		return nil, s.refNotFound("fetch", nil)
	}
	return s.peel(st, ref.Hash())
}

// fetchCommit fetches one commit by its SHA. A server that lets clients
// ask for any reachable commit (uploadpack.allowReachableSHA1InWant or
// allowAnySHA1InWant, which GitHub, GitLab and Gitea allow) gets the
// commit alone at depth 1; from another, every branch and tag is fetched
// with its whole history (go-git cannot negotiate a deeper shallow fetch
// for an unadvertised commit), and the commit is looked up there. Either
// way this happens once per Source: a pinned revision never moves, so the
// reconciler keeps the artifact.
func (s *Source) fetchCommit(ctx context.Context, st *checkedStorage, h plumbing.Hash) (*object.Commit, error) {
	err := s.fetchRefSpecs(ctx, st, 1, config.RefSpec("+"+h.String()+":"+pinnedRef.String()))
	if errors.Is(err, gogit.ErrExactSHA1NotSupported) {
		err = s.fetchRefSpecs(ctx, st, 0, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*")
	}
	if err != nil {
		return nil, err
	}
	c, err := object.GetCommit(st, h)
	if errors.Is(err, plumbing.ErrObjectNotFound) {
		return nil, s.refNotFound("fetch", nil)
	}
	if err != nil {
		return nil, s.newError("fetch", nil, "read commit "+h.String(), err)
	}
	return c, nil
}

// fetchRefSpecs is one fetch (an advertisement and an upload-pack
// exchange over http) of specs into st, at depth (0: whole history).
func (s *Source) fetchRefSpecs(ctx context.Context, st *checkedStorage, depth int, specs ...config.RefSpec) error {
	remote := gogit.NewRemote(st, &config.RemoteConfig{Name: gogit.DefaultRemoteName, URLs: []string{s.url}})
	err := remote.FetchContext(ctx, &gogit.FetchOptions{
		RefSpecs: specs,
		Depth:    depth,
		Tags:     gogit.NoTags,
		Auth:     s.auth,
		CABundle: s.opts.Auth.CABundle,
	})
	switch {
	case err == nil, errors.Is(err, gogit.NoErrAlreadyUpToDate):
		return nil
	case errors.Is(err, gogit.ErrExactSHA1NotSupported):
		return err
	case st.err != nil:
		return s.newError("fetch", nil, "", st.err)
	case s.ref.kind == refCommit && strings.Contains(err.Error(), "not our ref"):
		// git upload-pack's answer to a want it does not have.
		return s.refNotFound("fetch", nil)
	}
	return s.classify("fetch", err)
}

// peel follows annotated tags from h to the commit they point at.
func (s *Source) peel(st *checkedStorage, h plumbing.Hash) (*object.Commit, error) {
	for range 10 { // git refuses deeper chains of tags, too
		obj, err := st.EncodedObject(plumbing.AnyObject, h)
		if err != nil {
			return nil, s.newError("fetch", nil, "read object "+h.String(), err)
		}
		switch obj.Type() {
		case plumbing.CommitObject:
			return object.DecodeCommit(st, obj)
		case plumbing.TagObject:
			tag, err := object.DecodeTag(st, obj)
			if err != nil {
				return nil, s.newError("fetch", nil, "read tag "+h.String(), err)
			}
			h = tag.Target
		default:
			return nil, s.newError("fetch", sources.ErrRefused,
				fmt.Sprintf("%s points at a %s, not a commit: check %s", s.ref, obj.Type(), s.ref.field()), nil)
		}
	}
	return nil, s.newError("fetch", sources.ErrRefused, s.ref.String()+" is a chain of more than 10 tags", nil)
}

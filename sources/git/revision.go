package git

import (
	"context"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/storage/memory"
)

// Revision implements sources.Source. For a branch, a tag, a semver range
// or a ref name it lists the remote's refs, as `git ls-remote` does (one
// request over http, no objects downloaded), and returns
// "<branch|tag|ref>@sha1:<commit>"; an annotated tag gives the commit it
// points at. A pinned commit is its own revision, "sha1:<commit>": the
// remote is not asked at all, Fetch finds out whether the commit exists.
func (s *Source) Revision(ctx context.Context) (string, error) {
	if s.ref.kind == refCommit {
		return target{commit: plumbing.NewHash(s.ref.value)}.revision(), nil
	}
	refs, err := s.listRefs(ctx)
	if err != nil {
		return "", s.classify("list refs of", err)
	}
	t, err := s.resolve("list refs of", refs)
	if err != nil {
		return "", err
	}
	return t.revision(), nil
}

// listRefs is one ls-remote, with the peeled commits of annotated tags
// appended as "<tag>^{}" (they come in the same advertisement).
func (s *Source) listRefs(ctx context.Context) ([]*plumbing.Reference, error) {
	remote := gogit.NewRemote(memory.NewStorage(), &config.RemoteConfig{
		Name: gogit.DefaultRemoteName,
		URLs: []string{s.url},
	})
	return remote.ListContext(ctx, &gogit.ListOptions{
		Auth:          s.auth,
		CABundle:      s.opts.Auth.CABundle,
		PeelingOption: gogit.AppendPeeled,
	})
}

// revision formats the revision of a branch, tag or ref the way every
// Capstan status shows it.
func revision(label string, hash plumbing.Hash) string {
	return label + "@sha1:" + hash.String()
}

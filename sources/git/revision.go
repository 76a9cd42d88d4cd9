package git

import (
	"context"
	"slices"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/storage/memory"
)

// Revision implements sources.Source: it lists the remote's refs, as
// `git ls-remote` does (one request over http, no objects downloaded), and
// returns "<branch>@sha1:<hash>" for the followed branch.
func (s *Source) Revision(ctx context.Context) (string, error) {
	remote := gogit.NewRemote(memory.NewStorage(), &config.RemoteConfig{
		Name: gogit.DefaultRemoteName,
		URLs: []string{s.url},
	})
	refs, err := remote.ListContext(ctx, &gogit.ListOptions{
		Auth:          s.auth,
		CABundle:      s.opts.Auth.CABundle,
		PeelingOption: gogit.IgnorePeeled,
	})
	if err != nil {
		return "", s.classify("list refs of", err)
	}
	want := plumbing.NewBranchReferenceName(s.branch)
	var branches []string
	for _, ref := range refs {
		if ref.Name() == want && ref.Type() == plumbing.HashReference {
			return revision(s.branch, ref.Hash()), nil
		}
		if ref.Name().IsBranch() {
			branches = append(branches, ref.Name().Short())
		}
	}
	slices.Sort(branches)
	return "", s.branchNotFound("list refs of", branches)
}

// revision formats a revision the way every Capstan status shows it.
func revision(branch string, hash plumbing.Hash) string {
	return branch + "@sha1:" + hash.String()
}

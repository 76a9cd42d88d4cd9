package git

import (
	"context"
	"os"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/storage/filesystem"

	"github.com/capstan-dev/capstan/sources"
)

// Fetch implements sources.Source: a shallow (depth 1) fetch of the
// followed ref alone into a temporary directory, whose commit tree is
// then written into an Artifact: into a directory of Options.CacheDir
// when it is set, else into memory. The artifact's revision is the commit
// actually fetched, which may be newer than what Revision answered a
// moment before. A semver range lists the tags first (one request more),
// to fetch the highest matching tag; a pinned commit is fetched by its
// SHA where the server allows it (see fetchCommit).
//
// The pack is streamed to disk and checked object by object as it comes
// (see packCheck), so a repository that breaks a limit is refused before
// go-git indexes it, and memory holds at most one object of the pack at a
// time, never the repository. Every Fetch starts afresh: Fetch only runs
// when the revision moved, when the delta would rarely be much smaller
// than the snapshot anyway.
func (s *Source) Fetch(ctx context.Context) (*sources.Artifact, error) {
	want, err := s.fetchTarget(ctx)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(s.cacheDir(), "git-")
	if err != nil {
		return nil, s.newError("fetch", nil, "create a directory for the clone", err)
	}
	defer os.RemoveAll(tmp)
	st := &checkedStorage{
		Storage: filesystem.NewStorageWithOptions(osfs.New(tmp), cache.NewObjectLRU(objectCacheBytes),
			filesystem.Options{LargeObjectThreshold: largeObjectBytes}),
		dir:    tmp,
		limits: s.limits,
	}
	defer st.Close() // the pack's file descriptors, before the directory goes
	commit, err := s.fetchInto(ctx, st, want)
	if err != nil {
		return nil, err
	}
	want.commit = commit.Hash
	if s.verify != nil {
		if err := s.verify.verify(commit); err != nil {
			return nil, s.newError("fetch", nil, "", err)
		}
	}
	tree, err := commit.Tree()
	if err != nil {
		return nil, s.newError("fetch", nil, "read tree of commit "+commit.Hash.String(), err)
	}
	b, err := s.newBuilder()
	if err != nil {
		return nil, s.newError("fetch", nil, "create the artifact directory", err)
	}
	if err := copyTree(ctx, st, tree, b); err != nil {
		b.Discard()
		return nil, s.newError("fetch", nil, "commit "+commit.Hash.String(), err)
	}
	return b.Artifact(want.revision()), nil
}

// go-git's memory while it reads the cloned repository: objects up to
// largeObjectBytes are read whole (and kept in a cache of
// objectCacheBytes), larger ones streamed from the pack.
const (
	largeObjectBytes = 256 << 10
	objectCacheBytes = 4 << 20
)

// cacheDir is where clones and artifacts go.
func (s *Source) cacheDir() string {
	if s.opts.CacheDir != "" {
		return s.opts.CacheDir
	}
	return os.TempDir()
}

// newBuilder returns the builder of an artifact: on disk when the options
// name a cache directory.
func (s *Source) newBuilder() (*sources.Builder, error) {
	if s.opts.CacheDir == "" {
		return sources.NewMemFS(s.limits), nil
	}
	dir, err := os.MkdirTemp(s.opts.CacheDir, "artifact-")
	if err != nil {
		return nil, err
	}
	b, err := sources.NewDiskFS(dir, s.limits)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return b, nil
}

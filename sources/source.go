package sources

import (
	"context"
	"io/fs"
	"os"
)

// Artifact is one immutable snapshot of a source: the revision it was taken at
// and a read-only filesystem holding its files. The filesystem never contains
// symlinks, device files or paths that leave its root; sources enforce that
// before they hand an Artifact out.
type Artifact struct {
	// Revision identifies the snapshot, e.g. "main@sha1:4f2c..." for git.
	Revision string
	// FS is the artifact's content, rooted at the repository root.
	FS fs.FS
	// Size is the total size in bytes of the regular files in FS.
	Size int64
	// Dir is the directory holding FS's files when the source wrote them
	// to disk (its options named a cache directory), "" when FS is in
	// memory. Whoever holds the Artifact removes it, with Remove, once
	// nothing reads FS any more; a Store does that for the daemon.
	Dir string
}

// Remove deletes the files of an artifact on disk; FS must not be read
// afterwards. It does nothing for an artifact in memory.
func (a *Artifact) Remove() error {
	if a == nil || a.Dir == "" {
		return nil
	}
	return os.RemoveAll(a.Dir)
}

// Source is where cluster definitions come from. Implementations keep
// whatever local cache they need between calls; they are safe for use by one
// goroutine at a time.
type Source interface {
	// Revision asks the remote for its current revision without fetching
	// content (for git an ls-remote). The reconciler calls it on every poll
	// and calls Fetch only when the answer differs from what it last applied.
	Revision(ctx context.Context) (string, error)
	// Fetch downloads the current content and returns it as an Artifact.
	Fetch(ctx context.Context) (*Artifact, error)
}

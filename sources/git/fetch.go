package git

import (
	"context"
	"fmt"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/capstan-dev/capstan/sources"
)

// Fetch implements sources.Source: a shallow (depth 1) clone of the
// followed branch into memory, whose commit tree is then copied into an
// Artifact. The artifact's revision is the commit actually fetched, which
// may be newer than what Revision answered a moment before.
//
// Every Fetch clones afresh rather than fetching into a kept repository:
// go-git's in-memory storage never drops objects, so a kept one would grow
// with every revision, and Fetch only runs when the revision moved, when
// the delta would rarely be much smaller than the snapshot anyway.
func (s *Source) Fetch(ctx context.Context) (*sources.Artifact, error) {
	st := &limitedStorage{Storage: memory.NewStorage(), limits: s.limits}
	repo, err := gogit.CloneContext(ctx, st, nil, &gogit.CloneOptions{
		URL:           s.url,
		Auth:          s.auth,
		CABundle:      s.opts.Auth.CABundle,
		ReferenceName: plumbing.NewBranchReferenceName(s.branch),
		SingleBranch:  true,
		Depth:         1,
		Tags:          gogit.NoTags,
		NoCheckout:    true,
	})
	if err != nil {
		if st.err != nil {
			hint := ""
			if p := st.pathOf(st.blob); p != "" {
				hint = "file " + p
			}
			return nil, s.newError("fetch", nil, hint, st.err)
		}
		return nil, s.classify("fetch", err)
	}
	head, err := repo.Head()
	if err != nil {
		return nil, s.classify("fetch", err)
	}
	commit, err := repo.CommitObject(head.Hash())
	if err != nil {
		return nil, s.newError("fetch", nil, "read commit "+head.Hash().String(), err)
	}
	if s.verify != nil {
		if err := s.verify.verify(commit); err != nil {
			return nil, s.newError("fetch", nil, "", err)
		}
	}
	tree, err := commit.Tree()
	if err != nil {
		return nil, s.newError("fetch", nil, "read tree of commit "+head.Hash().String(), err)
	}
	b := sources.NewMemFS(s.limits)
	if err := copyTree(ctx, st, tree, b); err != nil {
		return nil, s.newError("fetch", nil, "commit "+head.Hash().String(), err)
	}
	return &sources.Artifact{
		Revision: revision(s.branch, head.Hash()),
		FS:       b.FS(),
		Size:     b.Size(),
	}, nil
}

// limitedStorage is in-memory storage that refuses a clone as soon as its
// blobs show that the artifact would break the limits, so that an
// oversized repository is not first downloaded in full. In a depth-1 clone
// every blob sits at one path at least, so these are lower bounds of what
// the artifact would hold; the exact checks happen in the MemFSBuilder.
type limitedStorage struct {
	*memory.Storage
	limits sources.Limits
	blobs  int
	bytes  int64
	err    error
	blob   plumbing.Hash // the blob that broke a limit
}

// SetEncodedObject counts blobs before storing them.
func (l *limitedStorage) SetEncodedObject(obj plumbing.EncodedObject) (plumbing.Hash, error) {
	if obj.Type() == plumbing.BlobObject {
		l.blobs++
		l.bytes += obj.Size()
		switch {
		case obj.Size() > l.limits.MaxFileBytes:
			l.err = fmt.Errorf("%w: a file of %d bytes is over the limit of %d bytes per file",
				sources.ErrRefused, obj.Size(), l.limits.MaxFileBytes)
		case l.bytes > l.limits.MaxTotalBytes:
			l.err = fmt.Errorf("%w: the files are over the limit of %d bytes in total",
				sources.ErrRefused, l.limits.MaxTotalBytes)
		case l.blobs > l.limits.MaxFiles:
			l.err = fmt.Errorf("%w: the repository has more than the limit of %d files",
				sources.ErrRefused, l.limits.MaxFiles)
		}
		if l.err != nil {
			l.blob = obj.Hash()
			return plumbing.ZeroHash, l.err
		}
	}
	return l.Storage.SetEncodedObject(obj)
}

// pathOf finds, best effort, a path of blob in the trees received before
// the clone was cut short, so that a refusal can name the file. Git sends
// a commit's trees before their blobs, so the path is usually there.
func (l *limitedStorage) pathOf(blob plumbing.Hash) string {
	commits, err := l.IterEncodedObjects(plumbing.CommitObject)
	if err != nil {
		return ""
	}
	defer commits.Close()
	obj, err := commits.Next()
	if err != nil {
		return ""
	}
	commit, err := object.DecodeCommit(l, obj)
	if err != nil {
		return ""
	}
	tree, err := object.GetTree(l, commit.TreeHash)
	if err != nil {
		return ""
	}
	return findBlob(l, tree, "", blob)
}

func findBlob(st storer.EncodedObjectStorer, t *object.Tree, dir string, blob plumbing.Hash) string {
	for _, e := range t.Entries {
		switch {
		case e.Hash == blob && e.Mode.IsFile():
			return join(dir, e.Name)
		case e.Mode == filemode.Dir:
			if sub, err := object.GetTree(st, e.Hash); err == nil {
				if p := findBlob(st, sub, join(dir, e.Name), blob); p != "" {
					return p
				}
			}
		}
	}
	return ""
}

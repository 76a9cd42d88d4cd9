package git

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"

	"github.com/capstan-dev/capstan/sources"
)

// copyTree adds every file of root to b: regular and executable files as
// they are, symlinks as copies of what they resolve to (a file, or a whole
// directory; sources.Symlinks refuses links that leave the tree, dangle or
// loop), nothing for submodules. It reads the commit's tree objects, never
// a worktree.
func copyTree(ctx context.Context, st storer.EncodedObjectStorer, root *object.Tree, b *sources.Builder) error {
	var links sources.Symlinks
	if err := walkTree(ctx, st, "", root, b, &links); err != nil {
		return err
	}
	return links.CopyInto(ctx, b)
}

func walkTree(ctx context.Context, st storer.EncodedObjectStorer, dir string, t *object.Tree, b *sources.Builder, links *sources.Symlinks) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, e := range t.Entries {
		if e.Name == "" || e.Name == "." || e.Name == ".." || strings.ContainsAny(e.Name, "/\x00") {
			return fmt.Errorf("%w: tree %q holds an entry named %q", sources.ErrRefused, dir, e.Name)
		}
		p := join(dir, e.Name)
		switch e.Mode {
		case filemode.Dir:
			sub, err := object.GetTree(st, e.Hash)
			if err != nil {
				return fmt.Errorf("read tree %s: %w", p, err)
			}
			if err := walkTree(ctx, st, p, sub, b, links); err != nil {
				return err
			}
		case filemode.Submodule:
			// A gitlink names a commit of another repository: not content.
		case filemode.Symlink:
			target, err := readLink(st, p, e)
			if err != nil {
				return err
			}
			if err := links.Add(p, target); err != nil {
				return err
			}
		case filemode.Regular, filemode.Deprecated, filemode.Executable:
			if err := copyBlob(st, b, p, e); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: %s has git mode %s, not a file, directory or symlink", sources.ErrRefused, p, e.Mode)
		}
	}
	return nil
}

// readLink returns the target of the symlink entry e at p.
func readLink(st storer.EncodedObjectStorer, p string, e object.TreeEntry) (string, error) {
	blob, err := object.GetBlob(st, e.Hash)
	if err != nil {
		return "", fmt.Errorf("read symlink %s: %w", p, err)
	}
	if blob.Size > sources.MaxSymlinkTarget {
		return "", fmt.Errorf("%w: symlink %s has a target of %d bytes, longer than %d", sources.ErrRefused, p, blob.Size, sources.MaxSymlinkTarget)
	}
	data, err := readBlob(blob)
	if err != nil {
		return "", fmt.Errorf("read symlink %s: %w", p, err)
	}
	return string(data), nil
}

// copyBlob adds the blob of e at dst, checking the limits before reading
// the content, which is streamed into the builder.
func copyBlob(st storer.EncodedObjectStorer, b *sources.Builder, dst string, e object.TreeEntry) error {
	blob, err := object.GetBlob(st, e.Hash)
	if err != nil {
		return fmt.Errorf("read %s: %w", dst, err)
	}
	if err := b.Allow(dst, blob.Size); err != nil {
		return err
	}
	r, err := blob.Reader()
	if err != nil {
		return fmt.Errorf("read %s: %w", dst, err)
	}
	defer r.Close()
	mode := fs.FileMode(0o644)
	if e.Mode == filemode.Executable {
		mode = 0o755
	}
	if err := b.AddReader(dst, r, blob.Size, mode); err != nil {
		if sources.IsReadError(err) {
			return fmt.Errorf("read %s: %w", dst, err)
		}
		return err
	}
	return nil
}

func readBlob(blob *object.Blob) ([]byte, error) {
	r, err := blob.Reader()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, blob.Size+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != blob.Size {
		return nil, fmt.Errorf("blob %s holds %d bytes, its header says %d", blob.Hash, len(data), blob.Size)
	}
	return data, nil
}

// join appends name to the tree path dir ("" for the root).
func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

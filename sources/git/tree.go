package git

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"

	"github.com/capstan-dev/capstan/sources"
)

const (
	// maxSymlinkHops is how many symlinks one path may pass through, as
	// Linux's ELOOP limit.
	maxSymlinkHops = 40
	// maxSymlinkTarget is the longest symlink target read (PATH_MAX).
	maxSymlinkTarget = 4096
)

// treeIndex is a commit tree flattened into paths, which lets symlinks be
// resolved component by component without a worktree.
type treeIndex struct {
	st       storer.EncodedObjectStorer
	entries  map[string]object.TreeEntry // by full path; no entry for the root
	children map[string][]string         // dir path ("" for the root) to child paths, in tree order
}

// copyTree adds every file of root to b: regular and executable files as
// they are, symlinks that resolve inside the tree as copies of their target
// (a file, or a whole directory), nothing for submodules. A symlink that
// leaves the tree, dangles or loops is refused.
func copyTree(ctx context.Context, st storer.EncodedObjectStorer, root *object.Tree, b *sources.MemFSBuilder) error {
	ix := &treeIndex{st: st, entries: make(map[string]object.TreeEntry), children: make(map[string][]string)}
	if err := ix.add(ctx, "", root); err != nil {
		return err
	}
	return ix.copyDir(ctx, b, "", "", nil)
}

// add indexes tree t found at dir, recursively.
func (ix *treeIndex) add(ctx context.Context, dir string, t *object.Tree) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, e := range t.Entries {
		if e.Name == "" || e.Name == "." || e.Name == ".." || strings.ContainsAny(e.Name, "/\x00") {
			return fmt.Errorf("%w: tree %q holds an entry named %q", sources.ErrRefused, dir, e.Name)
		}
		p := join(dir, e.Name)
		ix.entries[p] = e
		ix.children[dir] = append(ix.children[dir], p)
		if e.Mode != filemode.Dir {
			continue
		}
		sub, err := object.GetTree(ix.st, e.Hash)
		if err != nil {
			return fmt.Errorf("read tree %s: %w", p, err)
		}
		if err := ix.add(ctx, p, sub); err != nil {
			return err
		}
	}
	return nil
}

// copyDir adds the content of the real directory src at dst. expanding
// lists the real directories whose symlinks are being expanded, to detect
// a symlink that would copy a directory into itself.
func (ix *treeIndex) copyDir(ctx context.Context, b *sources.MemFSBuilder, dst, src string, expanding []string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, child := range ix.children[src] {
		e := ix.entries[child]
		out := join(dst, e.Name)
		var err error
		switch e.Mode {
		case filemode.Dir:
			err = ix.copyDir(ctx, b, out, child, expanding)
		case filemode.Regular, filemode.Deprecated, filemode.Executable:
			err = ix.copyBlob(b, out, e)
		case filemode.Submodule:
			// A gitlink names a commit of another repository, which this
			// source does not fetch.
		case filemode.Symlink:
			err = ix.copyLink(ctx, b, out, child, slices.Concat(expanding, []string{src}))
		default:
			err = fmt.Errorf("%w: %s has file mode %s, which an artifact cannot hold", sources.ErrRefused, child, e.Mode)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// copyLink adds at dst a copy of what the symlink at link resolves to.
func (ix *treeIndex) copyLink(ctx context.Context, b *sources.MemFSBuilder, dst, link string, expanding []string) error {
	target, e, err := ix.resolve(link)
	if err != nil {
		return err
	}
	switch e.Mode {
	case filemode.Dir:
		for _, dir := range expanding {
			if within(dir, target) {
				return fmt.Errorf("%w: symlink %s points to %s, which contains it: the copy would never end",
					sources.ErrRefused, link, displayPath(target))
			}
		}
		return ix.copyDir(ctx, b, dst, target, expanding)
	case filemode.Submodule:
		return nil
	default:
		return ix.copyBlob(b, dst, e)
	}
}

// resolve follows the symlink at link, component by component as the
// kernel would, and returns the real path it ends at and that path's
// entry (a synthetic directory entry for the root).
func (ix *treeIndex) resolve(link string) (string, object.TreeEntry, error) {
	refuse := func(format string, args ...any) (string, object.TreeEntry, error) {
		return "", object.TreeEntry{}, fmt.Errorf("%w: symlink %s %s", sources.ErrRefused, link, fmt.Sprintf(format, args...))
	}
	var cur []string
	if dir := path.Dir(link); dir != "." {
		cur = strings.Split(dir, "/")
	}
	pending := []string{link}
	first := true
	hops := 0
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		var p string
		if first {
			// Start by reading the link itself, like any later link met
			// on the way.
			first, p = false, link
		} else {
			switch c {
			case "", ".":
				continue
			case "..":
				if len(cur) == 0 {
					return refuse("points outside the repository")
				}
				cur = cur[:len(cur)-1]
				continue
			}
			p = join(strings.Join(cur, "/"), c)
		}
		e, ok := ix.entries[p]
		if !ok {
			return refuse("points to %s, which does not exist in the repository", p)
		}
		switch {
		case e.Mode == filemode.Symlink:
			if hops++; hops > maxSymlinkHops {
				return refuse("passes through more than %d symlinks", maxSymlinkHops)
			}
			target, err := ix.readLink(p)
			if err != nil {
				return "", object.TreeEntry{}, err
			}
			if strings.HasPrefix(target, "/") {
				return refuse("points to the absolute path %s, outside the repository", target)
			}
			pending = append(strings.Split(target, "/"), pending...)
		case e.Mode == filemode.Dir:
			cur = append(cur, c)
		case hasComponents(pending):
			return refuse("passes through %s, which is not a directory", p)
		default:
			return p, e, nil
		}
	}
	final := strings.Join(cur, "/")
	if final == "" {
		return "", object.TreeEntry{Mode: filemode.Dir}, nil
	}
	return final, ix.entries[final], nil
}

// readLink returns the target of the symlink at p.
func (ix *treeIndex) readLink(p string) (string, error) {
	e := ix.entries[p]
	blob, err := object.GetBlob(ix.st, e.Hash)
	if err != nil {
		return "", fmt.Errorf("read symlink %s: %w", p, err)
	}
	if blob.Size > maxSymlinkTarget {
		return "", fmt.Errorf("%w: symlink %s has a target of %d bytes, longer than %d", sources.ErrRefused, p, blob.Size, maxSymlinkTarget)
	}
	data, err := readBlob(blob)
	if err != nil {
		return "", fmt.Errorf("read symlink %s: %w", p, err)
	}
	if strings.ContainsRune(string(data), 0) || len(data) == 0 {
		return "", fmt.Errorf("%w: symlink %s has an empty or binary target", sources.ErrRefused, p)
	}
	return string(data), nil
}

// copyBlob adds the blob of e at dst, checking the limits before reading
// the content.
func (ix *treeIndex) copyBlob(b *sources.MemFSBuilder, dst string, e object.TreeEntry) error {
	blob, err := object.GetBlob(ix.st, e.Hash)
	if err != nil {
		return fmt.Errorf("read %s: %w", dst, err)
	}
	if err := b.Allow(dst, blob.Size); err != nil {
		return err
	}
	data, err := readBlob(blob)
	if err != nil {
		return fmt.Errorf("read %s: %w", dst, err)
	}
	mode := fs.FileMode(0o644)
	if e.Mode == filemode.Executable {
		mode = 0o755
	}
	return b.Add(dst, data, mode)
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

// hasComponents reports whether pending still names something below the
// current path (anything but empty and "." components).
func hasComponents(pending []string) bool {
	for _, c := range pending {
		if c != "" && c != "." {
			return true
		}
	}
	return false
}

// within reports whether p is dir or below it ("" is the root).
func within(p, dir string) bool {
	return dir == "" || p == dir || strings.HasPrefix(p, dir+"/")
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

func displayPath(p string) string {
	if p == "" {
		return "the repository root"
	}
	return p
}

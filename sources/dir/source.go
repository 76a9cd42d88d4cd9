package dir

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/capstan-dev/capstan/sources"
)

// DefaultDebounce is the default Options.Debounce.
const DefaultDebounce = 250 * time.Millisecond

// Options says which directory a Source reads.
type Options struct {
	// Path of the directory.
	Path string
	// Limits bound the artifact; zero fields take the defaults of
	// sources.DefaultLimits.
	Limits sources.Limits
	// Debounce is how long Watch waits after the last change before it
	// reports one; DefaultDebounce when zero.
	Debounce time.Duration
}

// Source reads one local directory.
type Source struct {
	path     string
	limits   sources.Limits
	debounce time.Duration
	changes  chan struct{}
	watching chan struct{} // closed once Watch is set up; tests set it
}

var _ sources.Source = (*Source)(nil)

// New checks that opts.Path is a directory and returns a Source.
func New(opts Options) (*Source, error) {
	if opts.Path == "" {
		return nil, fmt.Errorf("dir source: %w: path is empty", sources.ErrInvalid)
	}
	abs, err := filepath.Abs(opts.Path)
	if err != nil {
		return nil, fmt.Errorf("dir source %s: %w: %w", opts.Path, sources.ErrInvalid, err)
	}
	info, err := os.Stat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("dir source %s: %w: the directory does not exist", abs, sources.ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("dir source %s: %w: %w", abs, sources.ErrInvalid, err)
	case !info.IsDir():
		return nil, fmt.Errorf("dir source %s: %w: not a directory", abs, sources.ErrInvalid)
	}
	s := &Source{path: abs, limits: opts.Limits.WithDefaults(), debounce: opts.Debounce, changes: make(chan struct{}, 1)}
	if s.debounce <= 0 {
		s.debounce = DefaultDebounce
	}
	return s, nil
}

// Path returns the absolute path of the directory.
func (s *Source) Path() string { return s.path }

// Revision implements sources.Source: it reads the directory and returns
// the hash of its content. The directory is local, so there is no cheaper
// check that would be exact.
func (s *Source) Revision(ctx context.Context) (string, error) {
	art, err := s.Fetch(ctx)
	if err != nil {
		return "", err
	}
	return art.Revision, nil
}

// Fetch implements sources.Source: it reads the directory into an Artifact.
func (s *Source) Fetch(ctx context.Context) (*sources.Artifact, error) {
	return Snapshot(ctx, s.path, s.limits)
}

// Snapshot reads the directory at path into an Artifact whose revision is
// the hash of its content. It is what a Source fetches, and what `capstan
// push artifact` packs.
func Snapshot(ctx context.Context, path string, limits sources.Limits) (*sources.Artifact, error) {
	root, err := os.OpenRoot(path)
	if err != nil {
		return nil, fmt.Errorf("read directory %s: %w", path, err)
	}
	defer root.Close()
	b := sources.NewMemFS(limits)
	var links sources.Symlinks
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		switch t := d.Type(); {
		case d.IsDir():
			if d.Name() == ".git" {
				return fs.SkipDir
			}
			return nil
		case t&fs.ModeSymlink != 0:
			target, err := root.Readlink(p)
			if err != nil {
				return err
			}
			return links.Add(p, filepath.ToSlash(target))
		case t.IsRegular():
			return addFile(root, b, p)
		default:
			return fmt.Errorf("add %q: %w: %s; an artifact holds regular files only", p, sources.ErrRefused, describe(t))
		}
	})
	if err == nil {
		err = links.CopyInto(ctx, b)
	}
	if err != nil {
		return nil, fmt.Errorf("read directory %s: %w", path, err)
	}
	fsys := b.FS()
	rev, err := ContentHash(fsys)
	if err != nil {
		return nil, fmt.Errorf("read directory %s: %w", path, err)
	}
	return &sources.Artifact{Revision: rev, FS: fsys, Size: b.Size()}, nil
}

// addFile reads the regular file p of root into b, checking the limits
// before reading and reading no more than they allow.
func addFile(root *os.Root, b *sources.Builder, p string) error {
	f, err := root.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("add %q: %w: it changed to %s while being read", p, sources.ErrRefused, describe(info.Mode().Type()))
	}
	if err := b.Allow(p, info.Size()); err != nil {
		return err
	}
	// A file that grows while it is read is cut at the size it had: the
	// revision hashes what the artifact holds.
	return b.AddReader(p, f, info.Size(), info.Mode().Perm())
}

func describe(t fs.FileMode) string {
	switch {
	case t&fs.ModeDevice != 0:
		return "a device file"
	case t&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case t&fs.ModeSocket != 0:
		return "a socket"
	default:
		return "file type " + t.String()
	}
}

// ContentHash returns "sha256:<hex>" over every regular file of fsys in
// lexical order: its path, permission bits, length and bytes. Two trees
// with the same files have the same hash, whatever their timestamps.
func ContentHash(fsys fs.FS) (string, error) {
	h := sha256.New()
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		io.WriteString(h, p+"\x00"+strconv.FormatUint(uint64(info.Mode().Perm()), 8)+"\x00"+strconv.Itoa(len(data))+"\x00")
		h.Write(data)
		return nil
	})
	if err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

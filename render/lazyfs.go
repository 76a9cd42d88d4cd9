package render

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"path/filepath"
	"strings"

	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// lazyFS is the filesystem kustomize builds from. It is kustomize's own
// in-memory filesystem holding every directory of the artifact and an
// empty placeholder for every file, so that kustomize's listings, globs,
// existence checks and path confirmation behave exactly as on a copy; a
// file's content is read from the artifact the first time the check or
// kustomize opens it. Reads are bounded: no file larger than the per-file
// limit, and no more than the total limit for all the files one build
// reads. Unrelated content in a repository is never read.
type lazyFS struct {
	filesys.FileSystem
	inner  filesys.FileSystem
	src    fs.FS
	a      *artifact
	opts   Options
	loaded map[string]bool
	// read is how many bytes the build has read from src so far.
	read int64
	// err is the first limit or read error a load met, kept because
	// kustomize wraps errors in its own words: Build reports this one,
	// naming the file.
	err *Error
	// dec decrypts sops files as they are loaded; nil when Options.Decrypt is.
	dec *decryptor
	// sops notes which files sops encrypted, with or without dec.
	sops *sopsSources
}

func newLazyFS(src fs.FS, a *artifact, opts Options) *lazyFS {
	inner := filesys.MakeFsInMemory()
	return &lazyFS{FileSystem: inner, inner: inner, src: src, a: a, opts: opts, loaded: map[string]bool{}, dec: newDecryptor(opts.Decrypt), sops: newSopsSources()}
}

// relPath turns a path kustomize passes (absolute in the in-memory
// filesystem, or relative to its root) into an artifact path.
func relPath(p string) string {
	p = path.Clean("/" + filepath.ToSlash(p))
	if p == "/" {
		return "."
	}
	return strings.TrimPrefix(p, "/")
}

// load reads the file p of the artifact into the in-memory filesystem if
// it is a file not read yet. Its errors do not name p; the caller does.
func (l *lazyFS) load(p string) error {
	if l.loaded[p] {
		return nil
	}
	reported, ok := l.a.files[p]
	if !ok {
		return nil // a directory, or nothing: the in-memory filesystem says so
	}
	maxFile := l.opts.MaxFileBytes
	if reported > maxFile {
		return fileLimitError(reported, maxFile)
	}
	left := l.opts.MaxBytes - l.read
	data, err := readAtMost(l.src, p, min(maxFile, left))
	switch {
	case errors.Is(err, errTooLong) && int64(len(data)) > maxFile:
		return fileLimitError(int64(len(data)), maxFile)
	case errors.Is(err, errTooLong):
		return fmt.Errorf("reading it brings what the build reads past --max-render-bytes=%s (the files the overlay's kustomizations reach, each counted once); raise the limit or make the overlay smaller: %w",
			formatBytes(l.opts.MaxBytes), ErrLimit)
	case err != nil:
		return fmt.Errorf("read artifact: %w", err)
	}
	// Limits count what the artifact holds; the plaintext lives only in
	// the in-memory filesystem.
	l.read += int64(len(data))
	l.sops.read(p, data)
	data = l.dec.file(p, data)
	if err := l.inner.WriteFile("/"+p, data); err != nil {
		return err
	}
	l.loaded[p] = true
	l.a.files[p] = int64(len(data))
	return nil
}

func fileLimitError(size, limit int64) error {
	return fmt.Errorf("%d bytes, more than --max-file-bytes=%s; raise the limit or split the file: %w", size, formatBytes(limit), ErrLimit)
}

var errTooLong = errors.New("file longer than the bytes left to read")

// readAtMost reads the file p of fsys if it holds at most limit bytes, not
// trusting the size its listing reported. When it holds more, it returns
// errTooLong with the first limit+1 bytes, so that the caller can tell
// which limit it broke; it never reads more than that.
func readAtMost(fsys fs.FS, p string, limit int64) ([]byte, error) {
	f, err := fsys.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if limit < 0 {
		limit = 0
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return data, errTooLong
	}
	return data, nil
}

// kustomizeLoad loads a file kustomize asks for, recording a failure so
// that Build can report it with the file's name.
func (l *lazyFS) kustomizeLoad(name string) error {
	p := relPath(name)
	if err := l.load(p); err != nil {
		if l.err == nil {
			l.err = &Error{File: p, Err: err}
		}
		return err
	}
	return nil
}

// Open implements filesys.FileSystem.
func (l *lazyFS) Open(name string) (filesys.File, error) {
	if err := l.kustomizeLoad(name); err != nil {
		return nil, err
	}
	return l.inner.Open(name)
}

// ReadFile implements filesys.FileSystem.
func (l *lazyFS) ReadFile(name string) ([]byte, error) {
	if err := l.kustomizeLoad(name); err != nil {
		return nil, err
	}
	return l.inner.ReadFile(name)
}

// WriteFile implements filesys.FileSystem: a file kustomize writes is
// never replaced by the artifact's.
func (l *lazyFS) WriteFile(name string, data []byte) error {
	if err := l.inner.WriteFile(name, data); err != nil {
		return err
	}
	l.loaded[relPath(name)] = true
	return nil
}

// Create implements filesys.FileSystem, like WriteFile.
func (l *lazyFS) Create(name string) (filesys.File, error) {
	f, err := l.inner.Create(name)
	if err == nil {
		l.loaded[relPath(name)] = true
	}
	return f, err
}

// formatBytes writes a byte count the way the limit flags take it:
// "10MiB", "512KiB", "1000B".
func formatBytes(n int64) string {
	for _, u := range []struct {
		size int64
		name string
	}{{1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if n >= u.size && n%u.size == 0 {
			return fmt.Sprintf("%d%s", n/u.size, u.name)
		}
	}
	return fmt.Sprintf("%dB", n)
}

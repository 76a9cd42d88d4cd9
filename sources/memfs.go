package sources

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
)

// Default limits for an artifact. They are generous for cluster definitions
// (a few hundred small YAML files) and small enough that a hostile or
// mistaken repository can exhaust neither the controller's memory nor its
// cache directory. docs/limits.md explains each.
const (
	// DefaultMaxFiles is the default Limits.MaxFiles.
	DefaultMaxFiles = 10_000
	// DefaultMaxTotalBytes is the default Limits.MaxTotalBytes (128 MiB).
	DefaultMaxTotalBytes = 128 << 20
	// DefaultMaxFileBytes is the default Limits.MaxFileBytes (64 MiB).
	DefaultMaxFileBytes = 64 << 20
	// DefaultMaxDecompressedBytes is the default
	// Limits.MaxDecompressedBytes (256 MiB).
	DefaultMaxDecompressedBytes = 256 << 20
)

// Limits bounds what an artifact may hold. A zero field takes its default.
type Limits struct {
	// MaxFiles is the most regular files an artifact may hold.
	MaxFiles int
	// MaxTotalBytes is the most bytes all files together may hold
	// (`capstan run --max-artifact-bytes`).
	MaxTotalBytes int64
	// MaxFileBytes is the most bytes one file may hold (`capstan run
	// --max-file-bytes`). Git bounds every object of a pack with it too:
	// go-git inflates objects whole while it indexes a pack.
	MaxFileBytes int64
	// MaxDecompressedBytes bounds a compressed stream while it is
	// inflated (an OCI layer, the objects of a git pack), counting what is
	// skipped as well as what is kept, so that a small compressed bomb is
	// stopped at the limit (`capstan run --max-decompressed-bytes`).
	MaxDecompressedBytes int64
}

// DefaultLimits returns the limits used when a source sets none.
func DefaultLimits() Limits {
	return Limits{
		MaxFiles:             DefaultMaxFiles,
		MaxTotalBytes:        DefaultMaxTotalBytes,
		MaxFileBytes:         DefaultMaxFileBytes,
		MaxDecompressedBytes: DefaultMaxDecompressedBytes,
	}
}

// WithDefaults returns l with every zero or negative field replaced by its
// default.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits()
	if l.MaxFiles <= 0 {
		l.MaxFiles = d.MaxFiles
	}
	if l.MaxTotalBytes <= 0 {
		l.MaxTotalBytes = d.MaxTotalBytes
	}
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = d.MaxFileBytes
	}
	if l.MaxDecompressedBytes <= 0 {
		l.MaxDecompressedBytes = d.MaxDecompressedBytes
	}
	return l
}

// FormatBytes writes a byte count the way the limit flags of `capstan
// run` take it: "10MiB", "512KiB", "1000B".
func FormatBytes(n int64) string {
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

// Builder collects the files of one artifact and refuses anything an
// Artifact must not contain: paths that are absolute or climb out with "..",
// file types other than regular files, two entries at one path, and content
// beyond its Limits. Every source builds its Artifact.FS with it so that
// these checks live in one place. A builder from NewMemFS keeps the content
// in memory; one from NewDiskFS writes it into a directory as it comes, so
// that an artifact costs disk, not memory. The zero value is not usable.
type Builder struct {
	limits Limits
	files  map[string]*memFile
	dirs   map[string]struct{}
	total  int64
	// root is the directory the content is written to; nil keeps it in
	// memory.
	root *os.Root
	dir  string
}

// NewMemFS returns an empty builder that keeps the content in memory and
// enforces limits (zero fields take their defaults).
func NewMemFS(limits Limits) *Builder {
	return &Builder{
		limits: limits.WithDefaults(),
		files:  make(map[string]*memFile),
		dirs:   map[string]struct{}{".": {}},
	}
}

// NewDiskFS returns an empty builder that writes the content into dir, an
// empty directory that it then owns: the Artifact made from it carries dir
// in Artifact.Dir. Files are written as they are added and read back from
// there, through an os.Root, so nothing can lead outside dir.
func NewDiskFS(dir string, limits Limits) (*Builder, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("artifact directory: %w", err)
	}
	b := NewMemFS(limits)
	b.root, b.dir = root, dir
	return b, nil
}

// Dir returns the directory a disk builder writes to, "" for a memory one.
func (b *Builder) Dir() string { return b.dir }

// Artifact returns the artifact of the files added so far, at revision.
func (b *Builder) Artifact(revision string) *Artifact {
	return &Artifact{Revision: revision, FS: b.FS(), Size: b.Size(), Dir: b.dir}
}

// Discard removes what a disk builder wrote, for a fetch that failed.
func (b *Builder) Discard() {
	if b.root != nil {
		b.root.Close()
		os.RemoveAll(b.dir)
	}
}

// Limits returns the limits the builder enforces, defaults filled in.
func (b *Builder) Limits() Limits { return b.limits }

// Size returns the total bytes of the files added so far.
func (b *Builder) Size() int64 { return b.total }

// Len returns the number of files added so far.
func (b *Builder) Len() int { return len(b.files) }

// Allow reports, without adding anything, whether a regular file of size
// bytes could be added at name. Sources call it before they read a file's
// content so that an oversized file is refused before it is in memory.
func (b *Builder) Allow(name string, size int64) error {
	_, err := b.check(name, size)
	return err
}

// Add adds a file at name (a slash-separated path relative to the artifact
// root; "./a" and "a//b" are cleaned to "a" and "a/b"). Only the permission
// bits of mode are kept; any type bit (directory, symlink, device, pipe,
// socket...) is refused. A memory builder keeps data without copying it:
// the caller must not modify it afterwards. Every refusal wraps ErrRefused
// and names the path and, where one applies, the limit.
func (b *Builder) Add(name string, data []byte, mode fs.FileMode) error {
	return b.AddReader(name, bytesReader(data), int64(len(data)), mode)
}

// AddReader adds a file of size bytes read from r, as Add does. The
// limits are checked before r is read; a disk builder then copies r into
// its file through a small buffer, so a file never sits in memory whole.
// r must yield at least size bytes; more are left unread. An error of r
// comes back wrapped in a *ReadError, so that a caller can tell a broken
// input from a local failure such as a full disk.
func (b *Builder) AddReader(name string, r io.Reader, size int64, mode fs.FileMode) error {
	if mode.Type() != 0 {
		return fmt.Errorf("add %q: %w: not a regular file (mode %s); an artifact holds regular files only",
			name, ErrRefused, mode)
	}
	clean, err := b.check(name, size)
	if err != nil {
		return err
	}
	perm := mode.Perm()
	if perm == 0 {
		perm = 0o644
	}
	f := &memFile{size: size, mode: perm}
	if b.root == nil {
		if br, ok := r.(*byteSliceReader); ok && int64(len(br.data)) == size {
			f.data = br.data
		} else {
			f.data = make([]byte, size)
			if _, err := io.ReadFull(r, f.data); err != nil {
				return fmt.Errorf("add %q: %w", name, &ReadError{Err: err})
			}
		}
	} else if err := b.write(clean, r, size); err != nil {
		return fmt.Errorf("add %q: %w", name, err)
	}
	b.files[clean] = f
	b.total += size
	for d := path.Dir(clean); d != "."; d = path.Dir(d) {
		b.dirs[d] = struct{}{}
	}
	return nil
}

// write copies size bytes of r into the file clean of a disk builder.
func (b *Builder) write(clean string, r io.Reader, size int64) (err error) {
	if d := path.Dir(clean); d != "." {
		if err := b.root.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	out, err := b.root.OpenFile(clean, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			b.root.Remove(clean)
		}
	}()
	n, err := io.Copy(out, &readErrorReader{r: io.LimitReader(r, size)})
	if err != nil {
		return err
	}
	if n != size {
		return &ReadError{Err: io.ErrUnexpectedEOF}
	}
	return nil
}

// ReadError is the error of the reader a Builder copied a file from (a
// truncated archive, a connection that broke), as opposed to one of the
// builder itself (a full disk).
type ReadError struct {
	Err error
}

func (e *ReadError) Error() string { return "read: " + e.Err.Error() }

// Unwrap returns the reader's error.
func (e *ReadError) Unwrap() error { return e.Err }

// IsReadError reports whether err came from the reader a Builder copied
// from.
func IsReadError(err error) bool {
	var re *ReadError
	return errors.As(err, &re)
}

// readErrorReader marks the errors of r as ReadErrors for io.Copy, which
// would otherwise mix them with the writer's.
type readErrorReader struct{ r io.Reader }

func (r *readErrorReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		err = &ReadError{Err: err}
	}
	return n, err
}

// byteSliceReader lets a memory builder keep the slice Add was given
// instead of copying it.
type byteSliceReader struct {
	data []byte
	off  int
}

func bytesReader(data []byte) *byteSliceReader { return &byteSliceReader{data: data} }

func (r *byteSliceReader) Read(p []byte) (int, error) {
	if r.off >= len(r.data) {
		return 0, io.EOF
	}
	n := copy(p, r.data[r.off:])
	r.off += n
	return n, nil
}

// IsFile reports whether a file was added at the clean path name.
func (b *Builder) IsFile(name string) bool {
	_, ok := b.files[name]
	return ok
}

// AddCopy adds at dst a copy of the file already added at the clean path
// src, with its mode, for a link: it counts against the limits like any
// file.
func (b *Builder) AddCopy(dst, src string) error {
	if !b.IsFile(src) {
		return fmt.Errorf("copy %q: %w: not a file of the artifact", src, ErrRefused)
	}
	return b.copyFile(dst, src)
}

// copyFile adds at dst a copy of the file src already added, for a link.
func (b *Builder) copyFile(dst, src string) error {
	f := b.files[src]
	if b.root == nil {
		return b.Add(dst, f.data, f.mode)
	}
	in, err := b.root.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return b.AddReader(dst, in, f.size, f.mode)
}

// check validates name and size against the paths already added and the
// limits, and returns the cleaned path.
func (b *Builder) check(name string, size int64) (string, error) {
	clean, err := cleanPath(name)
	if err != nil {
		return "", err
	}
	if _, ok := b.files[clean]; ok {
		return "", fmt.Errorf("add %q: %w: a file already exists at that path", name, ErrRefused)
	}
	if _, ok := b.dirs[clean]; ok {
		return "", fmt.Errorf("add %q: %w: a directory already exists at that path", name, ErrRefused)
	}
	for d := path.Dir(clean); d != "."; d = path.Dir(d) {
		if _, ok := b.files[d]; ok {
			return "", fmt.Errorf("add %q: %w: parent %q is a file", name, ErrRefused, d)
		}
	}
	if size < 0 {
		return "", fmt.Errorf("add %q: %w: negative size %d", name, ErrRefused, size)
	}
	if size > b.limits.MaxFileBytes {
		return "", fmt.Errorf("add %q: %w: file is %d bytes, over the limit of %d bytes per file (--max-file-bytes=%s); raise the limit or split the file",
			name, ErrRefused, size, b.limits.MaxFileBytes, FormatBytes(b.limits.MaxFileBytes))
	}
	if len(b.files)+1 > b.limits.MaxFiles {
		return "", fmt.Errorf("add %q: %w: artifact would hold more than the limit of %d files",
			name, ErrRefused, b.limits.MaxFiles)
	}
	if b.total+size > b.limits.MaxTotalBytes {
		return "", fmt.Errorf("add %q: %w: artifact would hold %d bytes, over the limit of %d bytes in total (--max-artifact-bytes=%s); raise the limit or make the artifact smaller",
			name, ErrRefused, b.total+size, b.limits.MaxTotalBytes, FormatBytes(b.limits.MaxTotalBytes))
	}
	return clean, nil
}

// cleanPath turns a relative slash path into the form io/fs expects, or
// refuses it. A ".." element is refused even where cleaning would absorb it
// ("a/../b"): no honest source produces one, so it is treated as an attempt
// to escape.
func cleanPath(name string) (string, error) {
	switch {
	case name == "":
		return "", fmt.Errorf("add %q: %w: empty path", name, ErrRefused)
	case strings.ContainsRune(name, 0):
		return "", fmt.Errorf("add %q: %w: path contains a NUL byte", name, ErrRefused)
	case strings.ContainsRune(name, '\\'):
		// A backslash is a separator to Windows tooling and to some
		// kustomize code paths; refusing it keeps one meaning per path.
		return "", fmt.Errorf("add %q: %w: path contains a backslash; use / to separate directories", name, ErrRefused)
	case strings.HasPrefix(name, "/"):
		return "", fmt.Errorf("add %q: %w: absolute path; artifact paths are relative to its root", name, ErrRefused)
	}
	for _, elem := range strings.Split(name, "/") {
		if elem == ".." {
			return "", fmt.Errorf("add %q: %w: path climbs out of the artifact root with \"..\"", name, ErrRefused)
		}
	}
	clean := path.Clean(name)
	if clean == "." || !fs.ValidPath(clean) {
		return "", fmt.Errorf("add %q: %w: not a file path inside the artifact", name, ErrRefused)
	}
	return clean, nil
}

// FS returns a read-only snapshot of the files added so far. Later calls to
// Add do not change a snapshot already returned. A disk builder's FS reads
// the files from its directory.
func (b *Builder) FS() fs.FS {
	m := &memFS{
		files: make(map[string]*memFile, len(b.files)),
		dirs:  make(map[string][]fs.DirEntry, len(b.dirs)),
		root:  b.root,
	}
	for name, f := range b.files {
		m.files[name] = f
	}
	for d := range b.dirs {
		m.dirs[d] = nil
	}
	for name, f := range b.files {
		m.addEntry(name, memEntry{name: path.Base(name), size: f.size, mode: f.mode})
	}
	for d := range b.dirs {
		if d != "." {
			m.addEntry(d, memEntry{name: path.Base(d), mode: fs.ModeDir | 0o755})
		}
	}
	m.sortEntries()
	return m
}

package sources

import (
	"fmt"
	"io/fs"
	"path"
	"strings"
)

// Default limits for an artifact. They are generous for cluster definitions
// (a few hundred small YAML files) and small enough that a hostile or
// mistaken repository cannot exhaust the controller's memory.
const (
	// DefaultMaxFiles is the default Limits.MaxFiles.
	DefaultMaxFiles = 10_000
	// DefaultMaxTotalBytes is the default Limits.MaxTotalBytes (256 MiB).
	DefaultMaxTotalBytes = 256 << 20
	// DefaultMaxFileBytes is the default Limits.MaxFileBytes (64 MiB).
	DefaultMaxFileBytes = 64 << 20
)

// Limits bounds what an artifact may hold. A zero field takes its default.
type Limits struct {
	// MaxFiles is the most regular files an artifact may hold.
	MaxFiles int
	// MaxTotalBytes is the most bytes all files together may hold.
	MaxTotalBytes int64
	// MaxFileBytes is the most bytes one file may hold.
	MaxFileBytes int64
}

// DefaultLimits returns the limits used when a source sets none.
func DefaultLimits() Limits {
	return Limits{
		MaxFiles:      DefaultMaxFiles,
		MaxTotalBytes: DefaultMaxTotalBytes,
		MaxFileBytes:  DefaultMaxFileBytes,
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
	return l
}

// MemFSBuilder collects the files of one artifact and refuses anything an
// Artifact must not contain: paths that are absolute or climb out with "..",
// file types other than regular files, two entries at one path, and content
// beyond its Limits. Every source builds its Artifact.FS with it so that
// these checks live in one place. The zero value is not usable; call
// NewMemFS.
type MemFSBuilder struct {
	limits Limits
	files  map[string]*memFile
	dirs   map[string]struct{}
	total  int64
}

// NewMemFS returns an empty builder that enforces limits (zero fields take
// their defaults).
func NewMemFS(limits Limits) *MemFSBuilder {
	return &MemFSBuilder{
		limits: limits.WithDefaults(),
		files:  make(map[string]*memFile),
		dirs:   map[string]struct{}{".": {}},
	}
}

// Limits returns the limits the builder enforces, defaults filled in.
func (b *MemFSBuilder) Limits() Limits { return b.limits }

// Size returns the total bytes of the files added so far.
func (b *MemFSBuilder) Size() int64 { return b.total }

// Len returns the number of files added so far.
func (b *MemFSBuilder) Len() int { return len(b.files) }

// Allow reports, without adding anything, whether a regular file of size
// bytes could be added at name. Sources call it before they read a file's
// content so that an oversized file is refused before it is in memory.
func (b *MemFSBuilder) Allow(name string, size int64) error {
	_, err := b.check(name, size)
	return err
}

// Add adds a file at name (a slash-separated path relative to the artifact
// root; "./a" and "a//b" are cleaned to "a" and "a/b"). Only the permission
// bits of mode are kept; any type bit (directory, symlink, device, pipe,
// socket...) is refused. Add keeps data without copying it: the caller must
// not modify it afterwards. Every refusal wraps ErrRefused and names the
// path and, where one applies, the limit.
func (b *MemFSBuilder) Add(name string, data []byte, mode fs.FileMode) error {
	if mode.Type() != 0 {
		return fmt.Errorf("add %q: %w: not a regular file (mode %s); an artifact holds regular files only",
			name, ErrRefused, mode)
	}
	clean, err := b.check(name, int64(len(data)))
	if err != nil {
		return err
	}
	perm := mode.Perm()
	if perm == 0 {
		perm = 0o644
	}
	b.files[clean] = &memFile{data: data, mode: perm}
	b.total += int64(len(data))
	for d := path.Dir(clean); d != "."; d = path.Dir(d) {
		b.dirs[d] = struct{}{}
	}
	return nil
}

// check validates name and size against the paths already added and the
// limits, and returns the cleaned path.
func (b *MemFSBuilder) check(name string, size int64) (string, error) {
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
		return "", fmt.Errorf("add %q: %w: file is %d bytes, over the limit of %d bytes per file",
			name, ErrRefused, size, b.limits.MaxFileBytes)
	}
	if len(b.files)+1 > b.limits.MaxFiles {
		return "", fmt.Errorf("add %q: %w: artifact would hold more than the limit of %d files",
			name, ErrRefused, b.limits.MaxFiles)
	}
	if b.total+size > b.limits.MaxTotalBytes {
		return "", fmt.Errorf("add %q: %w: artifact would hold %d bytes, over the limit of %d bytes in total",
			name, ErrRefused, b.total+size, b.limits.MaxTotalBytes)
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
// Add do not change a snapshot already returned.
func (b *MemFSBuilder) FS() fs.FS {
	m := &memFS{
		files: make(map[string]*memFile, len(b.files)),
		dirs:  make(map[string][]fs.DirEntry, len(b.dirs)),
	}
	for name, f := range b.files {
		m.files[name] = f
	}
	for d := range b.dirs {
		m.dirs[d] = nil
	}
	for name, f := range b.files {
		m.addEntry(name, memEntry{name: path.Base(name), size: int64(len(f.data)), mode: f.mode})
	}
	for d := range b.dirs {
		if d != "." {
			m.addEntry(d, memEntry{name: path.Base(d), mode: fs.ModeDir | 0o755})
		}
	}
	m.sortEntries()
	return m
}

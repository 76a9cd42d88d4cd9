package sources

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"
)

// memFS is the read-only filesystem a Builder hands out. Directory
// listings are computed once, so walking an artifact of n files costs O(n)
// rather than the O(n²) of a flat map scanned per directory.
type memFS struct {
	files map[string]*memFile
	dirs  map[string][]fs.DirEntry // sorted by name
	// root holds the files' content when a disk builder wrote it; nil
	// when it is in memory.
	root *os.Root
}

var (
	_ fs.ReadDirFS  = (*memFS)(nil)
	_ fs.ReadFileFS = (*memFS)(nil)
	_ fs.StatFS     = (*memFS)(nil)
)

type memFile struct {
	data []byte // nil when the content is on disk
	size int64
	mode fs.FileMode
}

// memEntry is both the fs.FileInfo and the fs.DirEntry of one name. The
// modification time is always zero so that two artifacts of the same
// content are indistinguishable.
type memEntry struct {
	name string
	size int64
	mode fs.FileMode
}

func (e memEntry) Name() string               { return e.name }
func (e memEntry) Size() int64                { return e.size }
func (e memEntry) Mode() fs.FileMode          { return e.mode }
func (e memEntry) ModTime() time.Time         { return time.Time{} }
func (e memEntry) IsDir() bool                { return e.mode.IsDir() }
func (e memEntry) Sys() any                   { return nil }
func (e memEntry) Type() fs.FileMode          { return e.mode.Type() }
func (e memEntry) Info() (fs.FileInfo, error) { return e, nil }
func (e memEntry) String() string             { return fs.FormatDirEntry(e) }

func (m *memFS) addEntry(name string, e memEntry) {
	dir := path.Dir(name)
	m.dirs[dir] = append(m.dirs[dir], e)
}

func (m *memFS) sortEntries() {
	for _, entries := range m.dirs {
		slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	}
}

func (m *memFS) stat(op, name string) (memEntry, error) {
	if !fs.ValidPath(name) {
		return memEntry{}, &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	if f, ok := m.files[name]; ok {
		return memEntry{name: path.Base(name), size: f.size, mode: f.mode}, nil
	}
	if _, ok := m.dirs[name]; ok {
		return memEntry{name: path.Base(name), mode: fs.ModeDir | 0o755}, nil
	}
	return memEntry{}, &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
}

// Open implements fs.FS.
func (m *memFS) Open(name string) (fs.File, error) {
	e, err := m.stat("open", name)
	if err != nil {
		return nil, err
	}
	if e.IsDir() {
		return &openDir{entry: e, path: name, entries: m.dirs[name]}, nil
	}
	if m.root != nil {
		f, err := m.root.Open(name)
		if err != nil {
			return nil, err
		}
		return &diskFile{File: f, entry: e}, nil
	}
	return &openFile{entry: e, path: name, r: bytes.NewReader(m.files[name].data)}, nil
}

// Stat implements fs.StatFS.
func (m *memFS) Stat(name string) (fs.FileInfo, error) {
	e, err := m.stat("stat", name)
	if err != nil {
		return nil, err
	}
	return e, nil
}

// ReadFile implements fs.ReadFileFS. It returns a copy, so callers may
// modify the result without changing the artifact.
func (m *memFS) ReadFile(name string) ([]byte, error) {
	e, err := m.stat("read", name)
	if err != nil {
		return nil, err
	}
	if e.IsDir() {
		return nil, &fs.PathError{Op: "read", Path: name, Err: errIsDir}
	}
	if m.root != nil {
		return m.root.ReadFile(name)
	}
	return bytes.Clone(m.files[name].data), nil
}

// ReadDir implements fs.ReadDirFS.
func (m *memFS) ReadDir(name string) ([]fs.DirEntry, error) {
	e, err := m.stat("readdir", name)
	if err != nil {
		return nil, err
	}
	if !e.IsDir() {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: errNotDir}
	}
	return slices.Clone(m.dirs[name]), nil
}

type fsError string

func (e fsError) Error() string { return string(e) }

const (
	errIsDir  = fsError("is a directory")
	errNotDir = fsError("not a directory")
)

// openFile is an open regular file.
type openFile struct {
	entry memEntry
	path  string
	r     *bytes.Reader
}

func (f *openFile) Stat() (fs.FileInfo, error) { return f.entry, nil }
func (f *openFile) Close() error               { return nil }
func (f *openFile) Read(p []byte) (int, error) { return f.r.Read(p) }
func (f *openFile) ReadAt(p []byte, off int64) (int, error) {
	return f.r.ReadAt(p, off)
}
func (f *openFile) Seek(offset int64, whence int) (int64, error) {
	return f.r.Seek(offset, whence)
}

// diskFile is an open file of a disk artifact; it describes itself as the
// index does (no modification time), whatever the disk says.
type diskFile struct {
	*os.File
	entry memEntry
}

func (f *diskFile) Stat() (fs.FileInfo, error) { return f.entry, nil }

// openDir is an open directory; ReadDir pages through its entries.
type openDir struct {
	entry   memEntry
	path    string
	entries []fs.DirEntry
	offset  int
}

func (d *openDir) Stat() (fs.FileInfo, error) { return d.entry, nil }
func (d *openDir) Close() error               { return nil }
func (d *openDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.path, Err: errIsDir}
}

func (d *openDir) ReadDir(n int) ([]fs.DirEntry, error) {
	rest := d.entries[d.offset:]
	if n <= 0 {
		d.offset = len(d.entries)
		return slices.Clone(rest), nil
	}
	if len(rest) == 0 {
		return nil, io.EOF
	}
	n = min(n, len(rest))
	d.offset += n
	return slices.Clone(rest[:n]), nil
}

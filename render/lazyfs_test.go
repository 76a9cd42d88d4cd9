package render

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
)

// openCounter is an artifact that records which files are opened and how
// many bytes are read from them, and can lie about a file's size, as a
// hostile or racing source could.
type openCounter struct {
	fs.FS
	mu     sync.Mutex
	opened map[string]int
	read   int64
	// lies maps a file to the size its listing reports.
	lies map[string]int64
}

func newOpenCounter(m fstest.MapFS) *openCounter {
	return &openCounter{FS: m, opened: map[string]int{}, lies: map[string]int64{}}
}

func (o *openCounter) Open(name string) (fs.File, error) {
	f, err := o.FS.Open(name)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	o.opened[name]++
	o.mu.Unlock()
	return &countedFile{File: f, o: o}, nil
}

func (o *openCounter) ReadDir(name string) ([]fs.DirEntry, error) {
	entries, err := fs.ReadDir(o.FS, name)
	for i, e := range entries {
		if size, ok := o.lies[strings.TrimPrefix(name+"/"+e.Name(), "./")]; ok {
			entries[i] = lyingEntry{DirEntry: e, size: size}
		}
	}
	return entries, err
}

type countedFile struct {
	fs.File
	o *openCounter
}

func (f *countedFile) Read(p []byte) (int, error) {
	n, err := f.File.Read(p)
	f.o.mu.Lock()
	f.o.read += int64(n)
	f.o.mu.Unlock()
	return n, err
}

type lyingEntry struct {
	fs.DirEntry
	size int64
}

func (e lyingEntry) Info() (fs.FileInfo, error) {
	info, err := e.DirEntry.Info()
	return lyingInfo{FileInfo: info, size: e.size}, err
}

type lyingInfo struct {
	fs.FileInfo
	size int64
}

func (i lyingInfo) Size() int64 { return i.size }

const cmYAML = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n"

// Build reads the files the kustomizations reach and nothing else, so
// that unrelated content, however large, costs neither memory nor a
// limit.
func TestBuildReadsOnlyWhatTheKustomizationsReach(t *testing.T) {
	m := fstest.MapFS{
		"clusters/a/kustomization.yaml": {Data: []byte("resources: [cm.yaml, ../../bases/b]\n")},
		"clusters/a/cm.yaml":            {Data: []byte(cmYAML)},
		"bases/b/kustomization.yaml":    {Data: []byte("resources: [cm.yaml]\nnamePrefix: b-\n")},
		"bases/b/cm.yaml":               {Data: []byte(cmYAML)},
		"clusters/other/big.yaml":       {Data: []byte(strings.Repeat("x", 3<<20))},
		"docs/huge.bin":                 {Data: []byte(strings.Repeat("y", 5<<20))},
	}
	src := newOpenCounter(m)
	opts := DefaultOptions()
	opts.Path = "clusters/a"
	opts.MaxBytes = 1 << 20 // far less than the artifact holds
	opts.MaxFileBytes = 1 << 20
	objs, err := Build(context.Background(), src, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Errorf("got %d objects, want 2", len(objs))
	}
	for _, p := range []string{"clusters/other/big.yaml", "docs/huge.bin"} {
		if src.opened[p] != 0 {
			t.Errorf("%s was opened %d times; no kustomization reaches it", p, src.opened[p])
		}
	}
	for p, n := range src.opened {
		if n > 1 {
			t.Errorf("%s was opened %d times, want once", p, n)
		}
	}
	if src.read > 1<<10 {
		t.Errorf("read %d bytes from the artifact, want only the four small files", src.read)
	}
}

// The limits on what a build reads, as a user meets them: each names the
// file, the limit and the flag that raises it, and wraps ErrLimit.
func TestBuildReadLimits(t *testing.T) {
	big := strings.Repeat("# padding\n", 20_000) + cmYAML // 200 KB
	for _, tc := range []struct {
		name  string
		files fstest.MapFS
		lies  map[string]int64
		opts  func(*Options)
		want  string
		// notRead is a file that must not have been read past the limit.
		notRead string
	}{
		{
			name: "a resource larger than the per-file limit is refused from its size, unread",
			files: fstest.MapFS{
				"clusters/a/kustomization.yaml": {Data: []byte("resources: [big.yaml]\n")},
				"clusters/a/big.yaml":           {Data: []byte(big)},
			},
			opts:    func(o *Options) { o.MaxFileBytes = 100 << 10 },
			want:    "clusters/a/big.yaml: 200052 bytes, more than --max-file-bytes=100KiB; raise the limit or split the file",
			notRead: "clusters/a/big.yaml",
		},
		{
			name: "a file whose listing under-reports its size is cut at the limit",
			files: fstest.MapFS{
				"clusters/a/kustomization.yaml": {Data: []byte("resources: [big.yaml]\n")},
				"clusters/a/big.yaml":           {Data: []byte(big)},
			},
			lies: map[string]int64{"clusters/a/big.yaml": 10},
			opts: func(o *Options) { o.MaxFileBytes = 100 << 10 },
			want: "clusters/a/big.yaml: 102401 bytes, more than --max-file-bytes=100KiB",
		},
		{
			name: "files within the per-file limit that together pass the render limit",
			files: fstest.MapFS{
				"clusters/a/kustomization.yaml": {Data: []byte("resources: [one.yaml, two.yaml]\n")},
				"clusters/a/one.yaml":           {Data: []byte(big)},
				"clusters/a/two.yaml":           {Data: []byte(strings.Replace(big, "name: cm", "name: cm2", 1))},
			},
			opts: func(o *Options) { o.MaxBytes = 300 << 10 },
			want: "clusters/a/two.yaml: reading it brings what the build reads past --max-render-bytes=300KiB",
		},
		{
			name: "a file only kustomize reads, named by a builtin transformer, is bounded too",
			files: fstest.MapFS{
				"clusters/a/kustomization.yaml": {Data: []byte("resources: [cm.yaml]\ntransformers: [patch.yaml]\n")},
				"clusters/a/cm.yaml":            {Data: []byte(cmYAML)},
				"clusters/a/patch.yaml": {Data: []byte("apiVersion: builtin\nkind: PatchTransformer\nmetadata: {name: p}\n" +
					"path: big-patch.yaml\ntarget: {kind: ConfigMap}\n")},
				"clusters/a/big-patch.yaml": {Data: []byte(big)},
			},
			opts:    func(o *Options) { o.MaxFileBytes = 100 << 10 },
			want:    "clusters/a/big-patch.yaml: 200052 bytes, more than --max-file-bytes=100KiB",
			notRead: "clusters/a/big-patch.yaml",
		},
		{
			name: "too many objects names the flag",
			files: fstest.MapFS{
				"clusters/a/kustomization.yaml": {Data: []byte("resources: [cm.yaml, cm2.yaml]\n")},
				"clusters/a/cm.yaml":            {Data: []byte(cmYAML)},
				"clusters/a/cm2.yaml":           {Data: []byte(strings.Replace(cmYAML, "name: cm", "name: cm2", 1))},
			},
			opts: func(o *Options) { o.MaxObjects = 1 },
			want: "build would produce up to 2 objects, more than 1 (--max-objects)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := newOpenCounter(tc.files)
			for p, n := range tc.lies {
				src.lies[p] = n
			}
			opts := DefaultOptions()
			opts.Path = "clusters/a"
			tc.opts(&opts)
			_, err := Build(context.Background(), src, opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if !errors.Is(err, ErrLimit) {
				t.Errorf("errors.Is(err, ErrLimit) = false for %v", err)
			}
			if errs := renderErrors(err); len(errs) == 0 {
				t.Errorf("%v holds no *Error", err)
			}
			if tc.notRead != "" && src.opened[tc.notRead] != 0 {
				t.Errorf("%s was opened, want it refused from its size", tc.notRead)
			}
		})
	}
}

// A read error of the artifact (a file removed underneath) is an error
// naming the file, not a panic or an empty object.
func TestBuildReportsAFileThatCannotBeRead(t *testing.T) {
	src := &failingOpen{FS: fstest.MapFS{
		"kustomization.yaml": {Data: []byte("resources: [cm.yaml]\n")},
		"cm.yaml":            {Data: []byte(cmYAML)},
	}, fail: "cm.yaml"}
	_, err := Build(context.Background(), src, DefaultOptions())
	if err == nil || !strings.Contains(err.Error(), "cm.yaml: read artifact") {
		t.Fatalf("got %v, want a read error naming cm.yaml", err)
	}
}

type failingOpen struct {
	fs.FS
	fail string
}

func (f *failingOpen) Open(name string) (fs.File, error) {
	if name == f.fail {
		return nil, &fs.PathError{Op: "open", Path: name, Err: io.ErrUnexpectedEOF}
	}
	return f.FS.Open(name)
}

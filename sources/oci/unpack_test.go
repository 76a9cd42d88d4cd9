package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/sources"
)

// entry is one tar entry of a test tarball.
type entry struct {
	name     string
	typ      byte
	data     string
	link     string
	mode     int64
	size     int64 // header size when the data is not written (a lie)
	truncate bool  // write the header only, as a truncated archive has
}

func file(name, data string) entry   { return entry{name: name, typ: tar.TypeReg, data: data} }
func dir(name string) entry          { return entry{name: name, typ: tar.TypeDir} }
func symlink(name, to string) entry  { return entry{name: name, typ: tar.TypeSymlink, link: to} }
func hardlink(name, to string) entry { return entry{name: name, typ: tar.TypeLink, link: to} }

// tarball writes entries as a tar, gzip-compressed when gz is set.
func tarball(t testing.TB, gz bool, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	var tw *tar.Writer
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		tw = tar.NewWriter(zw)
	} else {
		tw = tar.NewWriter(&buf)
	}
	for _, e := range entries {
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		size := int64(len(e.data))
		if e.size != 0 {
			size = e.size
		}
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: mode, Format: tar.FormatPAX}
		if e.typ == tar.TypeReg {
			hdr.Size = size
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %q: %v", e.name, err)
		}
		if e.truncate {
			tw.Flush()
			break
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.data)); err != nil {
				t.Fatalf("tar data %q: %v", e.name, err)
			}
		}
	}
	if err := tw.Close(); err != nil && !strings.Contains(err.Error(), "missed writing") {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestUnpackAccepts(t *testing.T) {
	tests := []struct {
		name    string
		entries []entry
		want    map[string]string
	}{
		{"files and directories", []entry{dir("./"), dir("a/"), file("a/k.yaml", "k"), file("./b.yaml", "b")},
			map[string]string{"a/k.yaml": "k", "b.yaml": "b"}},
		{"a symlink to a file, copied", []entry{file("base/cm.yaml", "cm"), symlink("overlay/cm.yaml", "../base/cm.yaml")},
			map[string]string{"base/cm.yaml": "cm", "overlay/cm.yaml": "cm"}},
		{"a symlink before its target", []entry{symlink("l.yaml", "t.yaml"), file("t.yaml", "t")},
			map[string]string{"l.yaml": "t", "t.yaml": "t"}},
		{"a symlink to a directory, copied", []entry{file("base/a.yaml", "a"), file("base/sub/b.yaml", "b"), symlink("copy", "base")},
			map[string]string{"base/a.yaml": "a", "base/sub/b.yaml": "b", "copy/a.yaml": "a", "copy/sub/b.yaml": "b"}},
		{"a chain of symlinks", []entry{file("t", "t"), symlink("l1", "l2"), symlink("l2", "./t")},
			map[string]string{"t": "t", "l1": "t", "l2": "t"}},
		{"a hard link to an earlier file", []entry{file("t", "t"), hardlink("h", "t")},
			map[string]string{"t": "t", "h": "t"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Unpack(context.Background(), bytes.NewReader(tarball(t, true, tt.entries...)), UnpackLimits{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			_ = fs.WalkDir(b.FS(), ".", func(p string, d fs.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					data, _ := fs.ReadFile(b.FS(), p)
					got[p] = string(data)
				}
				return err
			})
			if len(got) != len(tt.want) {
				t.Errorf("unpacked %v, want %v", got, tt.want)
			}
			for p, data := range tt.want {
				if got[p] != data {
					t.Errorf("%s = %q, want %q (all: %v)", p, got[p], data, got)
				}
			}
		})
	}
}

// maliciousTarballs are archives an artifact must never be built from; they
// seed FuzzUnpack too.
var maliciousTarballs = []struct {
	name    string
	limits  UnpackLimits
	entries []entry
	want    string
}{
	{name: "traversal", entries: []entry{file("../../etc/cron.d/x", "x")}, want: `climbs out`},
	{name: "traversal-in-the-middle", entries: []entry{file("a/../../x", "x")}, want: `climbs out`},
	{name: "absolute-path", entries: []entry{file("/etc/passwd", "x")}, want: "absolute path"},
	{name: "directory-traversal", entries: []entry{dir("../up/")}, want: "climbs out"},
	{name: "symlink-escape", entries: []entry{symlink("etc", "../../etc"), file("a", "a")}, want: "points outside the artifact root"},
	{name: "symlink-absolute", entries: []entry{symlink("passwd", "/etc/passwd")}, want: "absolute path /etc/passwd"},
	{name: "symlink-then-write-through", entries: []entry{symlink("d", "/tmp"), file("d/x", "x")}, want: "absolute path /tmp"},
	{name: "symlink-dir-then-file-below", entries: []entry{file("t/a", "a"), symlink("d", "t"), file("d/x", "x")}, want: "a directory already exists"},
	{name: "symlink-chain-escape", entries: []entry{symlink("a", "b/../.."), file("b/x", "x")}, want: "outside the artifact root"},
	{name: "symlink-loop", entries: []entry{symlink("a", "b"), symlink("b", "a")}, want: "more than 40 symlinks"},
	{name: "symlink-into-itself", entries: []entry{file("d/x", "x"), symlink("d/self", "..")}, want: "contains it"},
	{name: "symlink-dangling", entries: []entry{symlink("a", "missing.yaml")}, want: "does not exist in the artifact"},
	{name: "hardlink-escape", entries: []entry{hardlink("h", "../../etc/shadow")}, want: "outside the artifact root"},
	{name: "hardlink-to-nothing", entries: []entry{hardlink("h", "nothing")}, want: "not a regular file"},
	{name: "char-device", entries: []entry{{name: "dev/null", typ: tar.TypeChar}}, want: "device file"},
	{name: "block-device", entries: []entry{{name: "sda", typ: tar.TypeBlock}}, want: "device file"},
	{name: "fifo", entries: []entry{{name: "pipe", typ: tar.TypeFifo}}, want: "named pipe"},
	{name: "huge-declared-size", entries: []entry{{name: "big", typ: tar.TypeReg, size: 1 << 40, truncate: true}}, want: "over the limit of 67108864 bytes per file"},
	{name: "over-total", limits: UnpackLimits{Files: sources.Limits{MaxTotalBytes: 10}}, entries: []entry{file("a", "123456"), file("b", "123456")}, want: "limit of 10 bytes in total"},
	{name: "too-many-files", limits: UnpackLimits{Files: sources.Limits{MaxFiles: 2}}, entries: []entry{file("a", ""), file("b", ""), file("c", "")}, want: "limit of 2 files"},
	{name: "too-many-entries", limits: UnpackLimits{MaxEntries: 3}, entries: []entry{dir("a/"), dir("b/"), dir("c/"), dir("d/")}, want: "limit of 3 tar entries"},
	{name: "symlink-fan-out", limits: UnpackLimits{Files: sources.Limits{MaxFiles: 4}}, entries: []entry{file("d/a", "a"), file("d/b", "b"), symlink("x", "d"), symlink("y", "d")}, want: "limit of 4 files"},
	{name: "duplicate", entries: []entry{file("a", "1"), file("./a", "2")}, want: "already exists"},
	{name: "truncated", entries: []entry{{name: "a", typ: tar.TypeReg, data: "", size: 100, truncate: true}}, want: "read \"a\""},
}

func TestUnpackRefuses(t *testing.T) {
	for _, tt := range maliciousTarballs {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Unpack(context.Background(), bytes.NewReader(tarball(t, true, tt.entries...)), tt.limits)
			if err == nil {
				t.Fatalf("Unpack = nil, want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Unpack = %q, want it to contain %q", err, tt.want)
			}
			if !errors.Is(err, sources.ErrRefused) {
				t.Errorf("Unpack = %v, want it to wrap sources.ErrRefused", err)
			}
		})
	}
}

// A gzip bomb: a small compressed layer that decompresses to far more
// than its files hold, here through PAX header records, which no file
// limit sees. The limit on the decompressed stream stops it.
func TestUnpackStopsAGzipBomb(t *testing.T) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(zw)
	comment := strings.Repeat("x", 512<<10)
	for i := range 6 {
		hdr := &tar.Header{Name: fmt.Sprintf("d%d/", i), Typeflag: tar.TypeDir, Mode: 0o755,
			PAXRecords: map[string]string{"comment": comment}, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	zw.Close()
	limits := UnpackLimits{Files: sources.Limits{MaxTotalBytes: 1 << 20}, MaxEntries: 8}
	_, err := Unpack(context.Background(), bytes.NewReader(buf.Bytes()), limits)
	if !errors.Is(err, sources.ErrRefused) || !strings.Contains(err.Error(), "decompressed layer is over the limit") {
		t.Fatalf("Unpack = %v, want a refusal for the decompressed size", err)
	}
	t.Logf("a %d-byte layer that decompresses to over 3 MiB was refused: %v", buf.Len(), err)
}

// FuzzUnpack checks that whatever bytes a registry hands over, Unpack
// either refuses them with sources.ErrRefused or returns only regular files
// at valid paths inside the root, within the limits. The seed corpus under
// testdata/fuzz/FuzzUnpack holds the malicious tarballs of
// maliciousTarballs; `go test` runs it.
func FuzzUnpack(f *testing.F) {
	for _, tt := range maliciousTarballs {
		f.Add(tarball(f, true, tt.entries...))
	}
	f.Add(tarball(f, false, file("a/b.yaml", "b"), symlink("c", "a")))
	limits := UnpackLimits{Files: sources.Limits{MaxFiles: 64, MaxTotalBytes: 1 << 16, MaxFileBytes: 1 << 14}, MaxEntries: 256}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := Unpack(context.Background(), bytes.NewReader(data), limits)
		if err != nil {
			if !errors.Is(err, sources.ErrRefused) {
				t.Fatalf("Unpack = %v, want it to wrap sources.ErrRefused", err)
			}
			return
		}
		var files int
		var total int64
		err = fs.WalkDir(b.FS(), ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !fs.ValidPath(p) || strings.HasPrefix(p, "/") || strings.Contains("/"+p+"/", "/../") || path.Clean(p) != p {
				t.Fatalf("unpacked a path outside the root: %q", p)
			}
			if d.IsDir() {
				return nil
			}
			if !d.Type().IsRegular() {
				t.Fatalf("unpacked %q of type %v", p, d.Type())
			}
			info, _ := d.Info()
			files++
			total += info.Size()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if files > limits.Files.MaxFiles || total > limits.Files.MaxTotalBytes {
			t.Fatalf("unpacked %d files, %d bytes, over the limits", files, total)
		}
	})
}

package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/static"

	"github.com/capstan-dev/capstan/sources"
)

// gzipMember compresses data as one gzip member; members concatenate into
// one stream that gzip readers read through.
func gzipMember(t testing.TB, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// tarHeader returns the header blocks of one tar entry, without content
// or end-of-archive marker.
func tarHeader(t testing.TB, hdr *tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(hdr); err != nil {
		t.Fatal(err)
	}
	tw.Flush()
	return buf.Bytes() // the header blocks; tar.Writer writes no content until asked
}

// Gzip bombs: small compressed layers that decompress to far more than an
// artifact may hold. Each is a multistream gzip whose members are cheap to
// make and repeat.
func paxBomb(t testing.TB, compressed int) []byte {
	member := gzipMember(t, tarHeader(t, &tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755, Format: tar.FormatPAX,
		PAXRecords: map[string]string{"comment": strings.Repeat("x", 1<<20-64)}}))
	var out bytes.Buffer
	for out.Len() < compressed {
		out.Write(member)
	}
	return out.Bytes()
}

func zeroFilesBomb(t testing.TB, compressed int, fileSize int64) []byte {
	zeros := gzipMember(t, make([]byte, fileSize))
	var out bytes.Buffer
	for i := 0; out.Len() < compressed; i++ {
		out.Write(gzipMember(t, tarHeader(t, &tar.Header{Name: fmt.Sprintf("zeros/%06d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: fileSize})))
		out.Write(zeros)
	}
	return out.Bytes()
}

// TestUnpackIntoDiskStopsGzipBombsWhileStreaming unpacks gzip bombs into a
// disk builder under small limits: each stops at the limit it breaks,
// named with its flag, having read no more than that limit, and leaves
// its files only on disk.
func TestUnpackIntoDiskStopsGzipBombsWhileStreaming(t *testing.T) {
	limits := UnpackLimits{Files: sources.Limits{MaxFileBytes: 256 << 10, MaxTotalBytes: 2 << 20, MaxDecompressedBytes: 4 << 20}}
	for _, tc := range []struct {
		name  string
		layer []byte
		want  string
	}{
		{"PAX records on directories", paxBomb(t, 256<<10), "decompressed layer is over the limit of 4194304 bytes (--max-decompressed-bytes=4MiB)"},
		{"files of zeros", zeroFilesBomb(t, 256<<10, 128<<10), "over the limit of 2097152 bytes in total (--max-artifact-bytes=2MiB)"},
		{"one file of a terabyte", append(gzipMember(t, tarHeader(t, &tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 40})), paxBomb(t, 64<<10)...),
			"file is 1099511627776 bytes, over the limit of 262144 bytes per file (--max-file-bytes=256KiB)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			b, err := sources.NewDiskFS(dir, limits.Files)
			if err != nil {
				t.Fatal(err)
			}
			counted := &countingReader{r: bytes.NewReader(tc.layer)}
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err = UnpackInto(testContext(t), counted, b, limits)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, sources.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("UnpackInto = %v, want a refusal containing %q", err, tc.want)
			}
			if counted.n >= int64(len(tc.layer)) {
				t.Errorf("read the whole %d-byte layer, want it stopped at the limit", len(tc.layer))
			}
			// Reading a layer whole would allocate hundreds of MiB; archive/tar
			// copies a PAX header a few times (more under -race).
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
				t.Errorf("allocated %d MiB, want a few buffers", alloc>>20)
			}
			t.Logf("read %d of %d compressed bytes, allocated %d KiB", counted.n, len(tc.layer), (after.TotalAlloc-before.TotalAlloc)>>10)
			b.Discard()
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("Discard left %s: %v", dir, err)
			}
		})
	}
}

type countingReader struct {
	r interface{ Read([]byte) (int, error) }
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// With a cache directory, Fetch writes the artifact into a directory of
// its own there, and a refused fetch leaves nothing behind.
func TestFetchIntoTheCacheDirectory(t *testing.T) {
	ctx := testContext(t)
	reg := newTestRegistry(t, "", "")
	writeImage(t, reg, "good", "v1", static.NewLayer(tarball(t, true, file("clusters/a/cm.yaml", "kind: ConfigMap\n"), symlink("link.yaml", "clusters/a/cm.yaml")), FluxContentMediaType))
	writeImage(t, reg, "bomb", "v1", static.NewLayer(paxBomb(t, 64<<10), FluxContentMediaType))
	cache := t.TempDir()
	limits := sources.Limits{MaxDecompressedBytes: 8 << 20}

	art, err := newSource(t, Options{URL: reg.URL("good"), Ref: Ref{Tag: "v1"}, CacheDir: cache, Limits: limits}).Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(art.Dir) != cache {
		t.Fatalf("Artifact.Dir = %q, want a directory in %s", art.Dir, cache)
	}
	for _, p := range []string{"clusters/a/cm.yaml", "link.yaml"} {
		if data, err := os.ReadFile(filepath.Join(art.Dir, p)); err != nil || string(data) != "kind: ConfigMap\n" {
			t.Errorf("%s on disk = %q, %v", p, data, err)
		}
	}

	_, err = newSource(t, Options{URL: reg.URL("bomb"), Ref: Ref{Tag: "v1"}, CacheDir: cache, Limits: limits}).Fetch(ctx)
	if !errors.Is(err, sources.ErrRefused) || !strings.Contains(err.Error(), "--max-decompressed-bytes=8MiB") {
		t.Fatalf("Fetch = %v, want the bomb refused", err)
	}
	if err := art.Remove(); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(cache); len(entries) != 0 {
		t.Errorf("the cache directory holds %v after the artifact was removed and the bomb refused", entries)
	}
}

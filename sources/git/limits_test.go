package git

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/sources"
)

// randomText returns n bytes that zlib cannot shrink much, so that a
// pack really carries them.
func randomText(n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	r := rand.New(rand.NewPCG(1, uint64(n)))
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[r.IntN(len(letters))]
	}
	return string(b)
}

// The limits as a user meets them on a git source: the refusal names the
// file (from the trees, which git sends before the blobs), the limit and
// the flag that raises it.
func TestLimitErrorsNameTheFileAndTheFlag(t *testing.T) {
	tests := []struct {
		name   string
		files  map[string]string
		limits sources.Limits
		want   string
	}{
		{
			name:   "a file over the per-file limit, in a subdirectory",
			files:  map[string]string{"clusters/a/big.yaml": randomText(4096), "clusters/a/ok.yaml": "ok"},
			limits: sources.Limits{MaxFileBytes: 2048},
			want:   "file clusters/a/big.yaml is 4096 bytes, over the limit of 2048 bytes per file (--max-file-bytes=2KiB); raise the limit or split the file",
		},
		{
			name:   "objects that inflate to more than the decompressed limit",
			files:  map[string]string{"a": strings.Repeat("a", 40000), "b": strings.Repeat("b", 40000)},
			limits: sources.Limits{MaxDecompressedBytes: 64 << 10},
			want:   "--max-decompressed-bytes=64KiB",
		},
		{
			name:   "files over the artifact limit",
			files:  map[string]string{"a": randomText(3000), "b": randomText(3001)},
			limits: sources.Limits{MaxTotalBytes: 4000},
			want:   "--max-artifact-bytes=4000B",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			repo, _ := newRepo(t, tt.files)
			cache := t.TempDir()
			_, err := httpSource(t, repo, func(o *Options) { o.Limits = tt.limits; o.CacheDir = cache }).Fetch(testContext(t))
			if !errors.Is(err, sources.ErrRefused) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Fetch = %v, want sources.ErrRefused saying %q", err, tt.want)
			}
			assertEmpty(t, cache)
		})
	}
}

// With a cache directory, the artifact is written there, one directory
// per fetch that the caller removes, and the clone leaves nothing behind.
func TestFetchWritesTheArtifactIntoTheCacheDirectory(t *testing.T) {
	repo, _ := newRepo(t, clusterFiles)
	cache := t.TempDir()
	art, err := httpSource(t, repo, func(o *Options) { o.CacheDir = cache }).Fetch(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(art.Dir) != cache {
		t.Fatalf("Artifact.Dir = %q, want a directory in %s", art.Dir, cache)
	}
	assertFiles(t, art.FS, clusterFiles)
	entries, _ := os.ReadDir(cache)
	if len(entries) != 1 {
		t.Errorf("the cache directory holds %d entries, want the artifact's only", len(entries))
	}
	if err := art.Remove(); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, cache)
}

// A file larger than the per-file limit is refused while the pack streams
// in, before go-git inflates it whole: fetching a repository with a 40 MB
// file under an 8 MiB limit allocates far less than the file.
func TestAnOversizedFileIsNeverHeldInMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("commits 40 MB")
	}
	repo, _ := newRepo(t, map[string]string{"big.yaml": randomText(40 << 20), "ok.yaml": "ok"})
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := httpSource(t, repo, func(o *Options) {
		o.Limits = sources.Limits{MaxFileBytes: 8 << 20}
		o.CacheDir = t.TempDir()
	}).Fetch(testContext(t))
	runtime.ReadMemStats(&after)
	if !errors.Is(err, sources.ErrRefused) || !strings.Contains(err.Error(), "file big.yaml is 41943040 bytes") {
		t.Fatalf("Fetch = %v, want big.yaml refused", err)
	}
	// The git server runs in this process too; its copies go through
	// small buffers.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 24<<20 {
		t.Errorf("the refused fetch allocated %d MiB, want well under the file's 40 MiB", alloc>>20)
	}
	t.Logf("allocated %d KiB while refusing a 40 MiB file", (after.TotalAlloc-before.TotalAlloc)>>10)
}

func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("%s left behind in %s", e.Name(), dir)
	}
}

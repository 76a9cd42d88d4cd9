package git

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/capstan-dev/capstan/sources"
)

// testPack encodes a pack of a commit whose tree holds the given files,
// with deltas between similar objects when window > 0.
func testPack(t testing.TB, files map[string]string, window uint) []byte {
	t.Helper()
	st := memory.NewStorage()
	put := func(typ plumbing.ObjectType, data []byte) plumbing.Hash {
		o := st.NewEncodedObject()
		o.SetType(typ)
		w, _ := o.Writer()
		w.Write(data)
		w.Close()
		h, err := st.SetEncodedObject(o)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	var tree bytes.Buffer
	var hashes []plumbing.Hash
	for _, name := range slices.Sorted(maps.Keys(files)) {
		h := put(plumbing.BlobObject, []byte(files[name]))
		hashes = append(hashes, h)
		tree.WriteString("100644 " + name + "\x00")
		tree.Write(h[:])
	}
	th := put(plumbing.TreeObject, tree.Bytes())
	ch := put(plumbing.CommitObject, []byte("tree "+th.String()+"\nauthor a <a> 0 +0000\ncommitter a <a> 0 +0000\n\nm\n"))
	var buf bytes.Buffer
	if _, err := packfile.NewEncoder(&buf, st, false).Encode(append([]plumbing.Hash{ch, th}, hashes...), window); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// The check passes a pack within the limits, deltas included, and names
// a file over the per-file limit from the tree it saw first.
func TestPackCheck(t *testing.T) {
	small := sources.Limits{MaxFileBytes: 4096}.WithDefaults()
	base := strings.Repeat("line of yaml\n", 200)
	for _, tc := range []struct {
		name   string
		pack   []byte
		limits sources.Limits
		want   string // "" for a pass
	}{
		{name: "within the limits", pack: testPack(t, map[string]string{"a.yaml": base, "b.yaml": base + "x"}, 10), limits: small},
		{name: "a file over the per-file limit is named", pack: testPack(t, map[string]string{"a.yaml": "a", "big.yaml": strings.Repeat("y", 5000)}, 0),
			limits: small, want: "file big.yaml is 5000 bytes, over the limit of 4096 bytes per file"},
		{name: "a delta whose result is over the limit", pack: testPack(t, map[string]string{"a.yaml": base, "b.yaml": base + base + base}, 10),
			limits: sources.Limits{MaxFileBytes: 3000}.WithDefaults(), want: "over the limit of 3000 bytes per"},
		{name: "more inflated bytes than the decompressed limit", pack: testPack(t, map[string]string{"a": base, "b": base + "b", "c": base + "c"}, 0),
			limits: sources.Limits{MaxDecompressedBytes: 6000}.WithDefaults(), want: "--max-decompressed-bytes=6000B"},
		{name: "not a pack", pack: []byte("PACK\x00\x00\x00\x02\x00\x00\x00\x01garbage"), limits: small, want: "read pack"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := (&packCheck{limits: tc.limits}).run(bytes.NewReader(tc.pack))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, sources.ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want sources.ErrRefused saying %q", err, tc.want)
			}
		})
	}
}

// A pack cut short, as by a broken connection, is not refused: a retry
// may well get all of it.
func TestPackCheckRetriesAPackCutShort(t *testing.T) {
	pack := testPack(t, map[string]string{"a.yaml": "a: b\n"}, 0)
	err := (&packCheck{limits: sources.DefaultLimits()}).run(bytes.NewReader(pack[:len(pack)/2]))
	if err == nil || errors.Is(err, sources.ErrRefused) {
		t.Fatalf("run = %v, want an error that is not a refusal", err)
	}
}

// FuzzPackCheck feeds arbitrary bytes to the pack check, which reads what
// a git server sends before anything else does: it must refuse them with
// sources.ErrRefused (or say they end early) or pass them, never panic,
// and never inflate more than its limit.
func FuzzPackCheck(f *testing.F) {
	f.Add(testPack(f, map[string]string{"a.yaml": "a: b\n", "b.yaml": "a: b\nc: d\n"}, 10))
	f.Add(testPack(f, map[string]string{"big": strings.Repeat("z", 3000)}, 0))
	f.Add([]byte("PACK\x00\x00\x00\x02\x00\x00\x00\x05"))
	limits := sources.Limits{MaxFiles: 16, MaxFileBytes: 2048, MaxTotalBytes: 8192, MaxDecompressedBytes: 16384}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &packCheck{limits: limits}
		err := c.run(bytes.NewReader(data))
		if err != nil && !errors.Is(err, sources.ErrRefused) && !strings.Contains(err.Error(), "the pack ended early") {
			t.Fatalf("run = %v, want it to wrap sources.ErrRefused, or say the pack ended early", err)
		}
		if c.inflated > limits.MaxDecompressedBytes+32<<10 {
			t.Fatalf("inflated %d bytes, over the limit", c.inflated)
		}
	})
}

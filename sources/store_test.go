package sources

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// diskArtifact writes an artifact of size bytes into the store's
// directory, as a source with CacheDir set would.
func diskArtifact(t *testing.T, s *Store, revision string, size int) *Artifact {
	t.Helper()
	dir, err := os.MkdirTemp(s.Dir(), "artifact-")
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewDiskFS(dir, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Add("f.yaml", make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	return b.Artifact(revision)
}

func exists(dir string) bool {
	_, err := os.Stat(dir)
	return err == nil
}

// The store keeps one artifact per key within its bound, least recently
// used evicted first, never one that is pinned or was used within
// minAge, and removes a replaced artifact once its last reader is done.
func TestStoreEvictsLeastRecentlyUsed(t *testing.T) {
	s, err := OpenStore(t.TempDir(), 250)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	tick := func() { now = now.Add(2 * DefaultStoreMinAge) }

	a := diskArtifact(t, s, "a1", 100)
	s.Put("a", a)
	tick()
	b := diskArtifact(t, s, "b1", 100)
	s.Put("b", b)
	tick()
	if _, ok := s.Get("a", "a1"); !ok { // a is now more recent than b
		t.Fatal("Get(a) missed")
	}
	tick()
	c := diskArtifact(t, s, "c1", 100)
	s.Put("c", c)
	if exists(b.Dir) || !exists(a.Dir) || !exists(c.Dir) {
		t.Fatalf("after c: a %v, b %v, c %v; want b, the least recently used, evicted", exists(a.Dir), exists(b.Dir), exists(c.Dir))
	}
	if got := s.Size(); got != 200 {
		t.Errorf("Size = %d, want 200", got)
	}
	if _, ok := s.Get("b", "b1"); ok {
		t.Error("Get(b) hit an evicted artifact")
	}

	// A pinned artifact survives eviction and replacement until released.
	release, ok := s.Pin(a)
	if !ok {
		t.Fatal("Pin(a) failed")
	}
	tick()
	a2 := diskArtifact(t, s, "a2", 100)
	s.Put("a", a2)
	if !exists(a.Dir) {
		t.Fatal("a replaced artifact was removed while pinned")
	}
	release()
	if exists(a.Dir) {
		t.Error("a replaced artifact stayed after its last reader")
	}
	if _, ok := s.Pin(a); ok {
		t.Error("Pin of a removed artifact succeeded")
	}

	// An artifact just fetched is not evicted, even over the bound.
	d := diskArtifact(t, s, "d1", 100)
	e := diskArtifact(t, s, "e1", 100)
	s.Put("d", d)
	s.Put("e", e)
	if !exists(d.Dir) || !exists(e.Dir) {
		t.Error("an artifact used less than minAge ago was evicted")
	}

	s.Drop("e")
	if exists(e.Dir) {
		t.Error("Drop left the artifact")
	}
}

// A new store removes the directories of stores whose process is gone,
// and leaves those of live stores alone.
func TestOpenStoreRemovesStaleStores(t *testing.T) {
	parent := t.TempDir()
	live, err := OpenStore(parent, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	dead := filepath.Join(parent, "run-dead")
	if err := os.MkdirAll(filepath.Join(dead, "artifact-1"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dead, ".lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	other, err := OpenStore(parent, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if exists(dead) {
		t.Error("the directory of a store nobody holds is still there")
	}
	if !exists(live.Dir()) {
		t.Error("the directory of a live store was removed")
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	if exists(other.Dir()) {
		t.Error("Close left the store's directory")
	}
}

// A disk builder writes each file as it is added and serves the same
// content, symlink copies included, as a memory one.
func TestDiskFSServesWhatWasAdded(t *testing.T) {
	dir := t.TempDir()
	b, err := NewDiskFS(dir, Limits{MaxFileBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Add("a/b.yaml", []byte("b: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var links Symlinks
	if err := links.Add("c/link.yaml", "../a/b.yaml"); err != nil {
		t.Fatal(err)
	}
	if err := links.CopyInto(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	if err := b.Add("big", make([]byte, 17), 0o644); err == nil {
		t.Error("a file over the limit was added")
	}
	fsys := b.Artifact("r").FS
	for _, p := range []string{"a/b.yaml", "c/link.yaml"} {
		data, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || string(data) != "b: 1\n" {
			t.Errorf("%s on disk = %q, %v", p, data, err)
		}
		f, err := fsys.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		info, _ := f.Stat()
		f.Close()
		if info.Size() != 5 || !info.ModTime().IsZero() {
			t.Errorf("%s: size %d, mtime %v; want 5 and no time", p, info.Size(), info.ModTime())
		}
	}
	b.Discard()
	if exists(dir) {
		t.Error("Discard left the directory")
	}
}

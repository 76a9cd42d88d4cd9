package sources

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// DefaultStoreMinAge is how long a Store keeps an artifact after its last
// use even when over its bound: long enough for whoever fetched it to
// start reading it.
const DefaultStoreMinAge = time.Minute

// Store is the daemon's artifact cache on disk. It owns a directory of its
// own below a parent (the --artifact-cache-dir), where sources write
// artifacts (their CacheDir option), and keeps the last artifact of each
// key (one per source) within a bound in bytes: when a new artifact takes
// it over the bound, the least recently used ones are removed first. An
// artifact pinned by a reader, or used less than DefaultStoreMinAge ago,
// is never removed; the bound may then be passed for a while. Several
// processes (and several stores in one process) may share a parent: each
// holds a lock on its own directory, and a new store removes the
// directories of stores whose process is gone.
type Store struct {
	dir      string
	lock     *os.File
	maxBytes int64
	minAge   time.Duration
	now      func() time.Time

	mu    sync.Mutex
	byKey map[string]*stored
	byArt map[*Artifact]*stored
	total int64
}

// stored is one artifact of a Store.
type stored struct {
	key  string
	art  *Artifact
	used time.Time
	pins int
	// current: still the artifact of its key. A replaced, evicted or
	// dropped artifact is removed from disk once nothing pins it.
	current bool
}

// OpenStore creates a store below parent, bounded to maxBytes of
// artifacts on disk, after removing what stores of processes that are gone
// left there.
func OpenStore(parent string, maxBytes int64) (*Store, error) {
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, fmt.Errorf("artifact cache %s: %w", parent, err)
	}
	removeStale(parent)
	dir, err := os.MkdirTemp(parent, "run-")
	if err != nil {
		return nil, fmt.Errorf("artifact cache %s: %w", parent, err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("artifact cache %s: %w", parent, err)
	}
	return &Store{
		dir: dir, lock: lock, maxBytes: maxBytes, minAge: DefaultStoreMinAge, now: time.Now,
		byKey: map[string]*stored{}, byArt: map[*Artifact]*stored{},
	}, nil
}

// removeStale removes the directories of stores that no process holds.
func removeStale(parent string) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "run-") {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		if stale(dir) {
			os.RemoveAll(dir)
		}
	}
}

// Dir is the directory sources write the store's artifacts into.
func (s *Store) Dir() string { return s.dir }

// Size is how many bytes of artifacts the store holds on disk, those
// waiting for their last reader included.
func (s *Store) Size() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// Put makes art the artifact of key: the one it replaces is removed once
// nothing pins it, and the least recently used artifacts are removed
// while the store is over its bound.
func (s *Store) Put(key string, art *Artifact) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.byKey[key]; ok {
		if old.art == art {
			old.used = s.now()
			return
		}
		s.retire(old)
	}
	st := &stored{key: key, art: art, used: s.now(), current: true}
	s.byKey[key] = st
	s.byArt[art] = st
	s.total += diskSize(art)
	s.evict()
}

// Get returns the artifact of key if it is at revision, marking it used.
func (s *Store) Get(key, revision string) (*Artifact, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.byKey[key]
	if !ok || st.art.Revision != revision {
		return nil, false
	}
	st.used = s.now()
	return st.art, true
}

// Pin keeps art on disk until release is called. ok is false when the
// store has removed art already (it was evicted or replaced and nothing
// pinned it): the caller fetches again. An artifact in memory, or one the
// store never held, is always ok.
func (s *Store) Pin(art *Artifact) (release func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, held := s.byArt[art]
	if !held {
		return func() {}, art.Dir == ""
	}
	st.pins++
	st.used = s.now()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			st.pins--
			st.used = s.now()
			if !st.current && st.pins == 0 {
				s.remove(st)
			}
			s.evict()
		})
	}, true
}

// Drop removes the artifact of key, once nothing pins it: the deployments
// that read it are gone.
func (s *Store) Drop(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.byKey[key]; ok {
		s.retire(st)
	}
}

// Close removes every artifact and the store's directory. Artifacts must
// not be read afterwards.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.byKey)
	clear(s.byArt)
	s.total = 0
	err := os.RemoveAll(s.dir)
	return errors.Join(err, s.lock.Close())
}

// retire takes st off its key and removes it unless pinned.
func (s *Store) retire(st *stored) {
	if s.byKey[st.key] == st {
		delete(s.byKey, st.key)
	}
	st.current = false
	if st.pins == 0 {
		s.remove(st)
	}
}

func (s *Store) remove(st *stored) {
	if _, ok := s.byArt[st.art]; !ok {
		return
	}
	delete(s.byArt, st.art)
	s.total -= diskSize(st.art)
	st.art.Remove()
}

// evict removes the least recently used artifacts that nothing pins and
// nobody used in the last minAge while the store is over its bound.
func (s *Store) evict() {
	for s.total > s.maxBytes {
		var oldest *stored
		for _, st := range s.byKey {
			if st.pins > 0 || s.now().Sub(st.used) < s.minAge {
				continue
			}
			if oldest == nil || st.used.Before(oldest.used) {
				oldest = st
			}
		}
		if oldest == nil {
			return
		}
		s.retire(oldest)
	}
}

// diskSize is what an artifact takes on disk, for the bound: its files.
func diskSize(art *Artifact) int64 {
	if art.Dir == "" {
		return 0
	}
	return art.Size
}

package dir

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// startWatch runs s.Watch until the test ends and waits until it watches.
func startWatch(t *testing.T, s *Source) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s.watching = make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- s.Watch(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
	select {
	case <-s.watching:
	case err := <-done:
		t.Fatalf("Watch ended before it watched: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Watch did not start watching within 30s")
	}
}

// waitChange waits for a report on s.Changes until the deadline and returns
// whether one came.
func waitChange(s *Source, within time.Duration) bool {
	select {
	case <-s.Changes():
		return true
	case <-time.After(within):
		return false
	}
}

func TestWatchReportsABurstOnce(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string]string{"overlay/cm.yaml": "v0"})
	debounce := 150 * time.Millisecond
	s, err := New(Options{Path: root, Debounce: debounce})
	if err != nil {
		t.Fatal(err)
	}
	startWatch(t, s)

	// An editor saving in steps, a formatter, a git checkout: many writes.
	start := time.Now()
	for i := range 25 {
		writeTree(t, root, map[string]string{"overlay/cm.yaml": fmt.Sprintf("v%d", i+1)})
	}
	if !waitChange(s, 30*time.Second) {
		t.Fatal("no change reported within 30s of a burst of writes")
	}
	t.Logf("burst of 25 writes reported after %v (debounce %v)", time.Since(start), debounce)
	want, err := Snapshot(context.Background(), root, s.limits)
	if err != nil {
		t.Fatal(err)
	}
	if rev, _ := s.Revision(context.Background()); rev != want.Revision {
		t.Errorf("Revision = %q, want the final content's %q", rev, want.Revision)
	}
	// Exactly one report: nothing more arrives once the burst is over
	// (several debounce periods of silence).
	if waitChange(s, 10*debounce) {
		t.Error("a second change was reported for the same burst")
	}

	// Rewriting the same bytes is no change.
	writeTree(t, root, map[string]string{"overlay/cm.yaml": "v25"})
	if waitChange(s, 10*debounce) {
		t.Error("a change was reported for a write of the same content")
	}

	// A file in a directory created after Watch started is seen too.
	start = time.Now()
	writeTree(t, root, map[string]string{"new/dir/x.yaml": "x"})
	if !waitChange(s, 30*time.Second) {
		t.Fatalf("no change reported for a file in a new directory (%s)", filepath.Join(root, "new/dir"))
	}
	t.Logf("new directory reported after %v", time.Since(start))
}

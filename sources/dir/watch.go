package dir

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// maxDelayFactor bounds how long a steady stream of writes can hold back a
// report: at most this many debounce periods after the first write.
const maxDelayFactor = 10

// Changes returns the channel on which Watch reports that the directory's
// revision changed. It holds at most one report: reports made while one is
// waiting are merged into it, so a slow reader sees one, not a backlog.
func (s *Source) Changes() <-chan struct{} { return s.changes }

// Watch follows the directory and every directory below it (except .git)
// until ctx ends, and reports on Changes each time the content hash
// differs from the one last reported, once writes have paused for the
// debounce period. It returns nil when ctx ends, or an error if the
// directory cannot be watched at all. Errors after that (a file being
// replaced while it is read) only delay the report to the next change.
func (s *Source) Watch(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", s.path, err)
	}
	defer w.Close()
	if err := addTree(w, s.path); err != nil {
		return fmt.Errorf("watch %s: %w", s.path, err)
	}
	last, _ := s.Revision(ctx)
	if s.watching != nil {
		close(s.watching)
	}

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var burstStart time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Has(fsnotify.Create) {
				if info, err := os.Lstat(ev.Name); err == nil && info.IsDir() && filepath.Base(ev.Name) != ".git" {
					// A new directory (or one moved in) is watched too,
					// with what was created inside it before the watch.
					_ = addTree(w, ev.Name)
				}
			}
			if burstStart.IsZero() {
				burstStart = time.Now()
			}
			if time.Since(burstStart) < maxDelayFactor*s.debounce {
				timer.Reset(s.debounce)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				// Events were lost: look at the content anyway.
				timer.Reset(s.debounce)
			}
		case <-timer.C:
			burstStart = time.Time{}
			rev, err := s.Revision(ctx)
			if err != nil || rev == last {
				continue
			}
			last = rev
			select {
			case s.changes <- struct{}{}:
			default:
			}
		}
	}
}

// addTree watches dir and every directory below it, except .git, without
// following symlinks.
func addTree(w *fsnotify.Watcher, dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // vanished meanwhile
		}
		if !d.IsDir() {
			return nil
		}
		if d.Name() == ".git" && p != dir {
			return filepath.SkipDir
		}
		return w.Add(p)
	})
}

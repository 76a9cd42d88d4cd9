//go:build unix

package sources

import (
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lockDir takes an exclusive lock on dir's lock file, held until the file
// is closed or the process ends, however it ends.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// stale says whether no process holds the lock of dir.
func stale(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR, 0)
	if err != nil {
		// No lock file: a store being created right now, or one that
		// died while it was.
		info, serr := os.Stat(dir)
		return os.IsNotExist(err) && serr == nil && time.Since(info.ModTime()) > time.Minute
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return false
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return true
}

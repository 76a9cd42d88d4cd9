//go:build !unix

package sources

import (
	"os"
	"path/filepath"
)

// lockDir creates dir's lock file; without flock, stores of processes
// that are gone are not recognised and stay until removed by hand.
func lockDir(dir string) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
}

func stale(string) bool { return false }

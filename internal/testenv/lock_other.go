//go:build !unix

package testenv

import (
	"context"
	"io"
)

// lockDir does nothing where flock is not available; concurrent builds are
// then possible but build.sh writes each binary under a temporary name.
func lockDir(context.Context, string, io.Writer) (func(), error) {
	return func() {}, nil
}

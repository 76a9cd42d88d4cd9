package reconciler

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// The package's tests are unit tests, except those that watch a real
// cluster: they share one control plane, started by the first of them
// and stopped when the tests end.
var shared struct {
	once sync.Once
	env  *testenv.Env
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop test control plane:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// controlPlane returns the package's control plane, starting it on first
// use; the test is skipped with -short.
func controlPlane(t *testing.T) *testenv.Env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	shared.once.Do(func() {
		// Generous because a first run may build the binaries.
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		shared.env, shared.err = testenv.Start(ctx, testenv.Options{Progress: os.Stderr})
	})
	if shared.err != nil {
		t.Fatalf("start test control plane: %v", shared.err)
	}
	return shared.env
}

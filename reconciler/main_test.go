package reconciler

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// The package's tests are unit tests, except those that watch a real
// cluster: they share one control plane, started by the first of them
// and stopped when the tests end.
var shared = testenv.Shared{Start: func(ctx context.Context) (*testenv.Env, error) {
	return testenv.Start(ctx, testenv.Options{Progress: os.Stderr})
}}

func TestMain(m *testing.M) {
	code := m.Run()
	if err := shared.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop the test control plane:", err)
		code = 1
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
	return shared.Get(t)
}

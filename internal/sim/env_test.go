package sim

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// shared is the control plane the simulator's tests share: the real
// Cluster API and Metal3 CRDs plus Capstan's (LCM included). Started by
// the first test that needs it, stopped by TestMain.
var shared = testenv.Shared{Start: func(ctx context.Context) (*testenv.Env, error) {
	dirs, err := testenv.ProviderCRDDirs(ctx)
	if err != nil {
		return nil, err
	}
	return testenv.Start(ctx, testenv.Options{
		CRDDirs: append([]string{"../../manifests/crds"}, dirs...), Progress: os.Stderr})
}}

func TestMain(m *testing.M) {
	code := m.Run()
	if err := shared.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop the test control plane:", err)
		code = 1
	}
	os.Exit(code)
}

// sharedEnv returns the shared control plane, starting it the first time.
func sharedEnv(t *testing.T) *testenv.Env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a control plane (skipped under -short)")
	}
	return shared.Get(t)
}

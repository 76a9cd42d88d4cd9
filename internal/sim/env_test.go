package sim

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// shared is the control plane the simulator's tests share: the real
// Cluster API and Metal3 CRDs plus Capstan's (LCM included). Started by
// the first test that needs it, stopped by TestMain.
var shared struct {
	once sync.Once
	env  *testenv.Env
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop the test control plane:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// sharedEnv returns the shared control plane, starting it the first time.
func sharedEnv(t *testing.T) *testenv.Env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a control plane (skipped under -short)")
	}
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		dirs, err := testenv.ProviderCRDDirs(ctx)
		if err != nil {
			shared.err = err
			return
		}
		shared.env, shared.err = testenv.Start(ctx, testenv.Options{
			CRDDirs: append([]string{"../../manifests/crds"}, dirs...), Progress: os.Stderr})
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.env
}

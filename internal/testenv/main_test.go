package testenv

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// env is the control plane shared by the tests of this package, with
// kube-controller-manager and the CRDs of testdata/crds.
var env *Env

// envStartTime is how long Start took for env.
var envStartTime time.Duration

func TestMain(m *testing.M) {
	// Generous because a first run may build the binaries.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	begin := time.Now()
	var err error
	env, err = Start(ctx, Options{
		CRDDirs:           []string{"testdata/crds"},
		ControllerManager: true,
		Progress:          os.Stderr,
	})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start test control plane:", err)
		os.Exit(1)
	}
	envStartTime = time.Since(begin)
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop test control plane:", err)
		code = 1
	}
	os.Exit(code)
}

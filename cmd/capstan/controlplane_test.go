package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// startControlPlane starts a control plane with Capstan's CRDs for one
// test, stopped when it ends; skipped under -short. It returns the env and
// a context bounded by the start's deadline for the test's setup.
func startControlPlane(t *testing.T) (*testenv.Env, context.Context) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a control plane; not under -short")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	t.Cleanup(cancel)
	env, err := testenv.Start(ctx, testenv.Options{CRDDirs: []string{"../../manifests/crds"}, Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	return env, ctx
}

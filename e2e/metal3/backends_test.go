package metal3

import (
	"context"
	"testing"

	"github.com/capstan-dev/capstan/internal/sim"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// backend builds the clusters of a test: the real Cluster API and Metal3
// controllers, or the simulator that plays them (docs/providers.md,
// docs/simulator.md). The seed 002 tests run on both: a difference is a
// bug in the simulator or in Capstan's gates.
type backend struct {
	name string
	env  *testenv.Env
	// play starts what plays the providers in ns until the test ends.
	play func(t *testing.T, ns string)
}

// backends are filled by TestMain: the real providers, then the
// simulator.
var backends []*backend

// realProviders runs the controllers themselves: env.Providers.
func realProviders(e *testenv.Env) *backend {
	return &backend{name: "real", env: e, play: func(t *testing.T, _ string) { providerLogs(t) }}
}

// simulatedProviders runs internal/sim in the test's namespace, at test
// pace, on a control plane of its own (the real controllers would fight
// it over the same objects).
func simulatedProviders(e *testenv.Env) *backend {
	return &backend{name: "sim", env: e, play: func(t *testing.T, ns string) {
		s, err := sim.New(env.Config, sim.TestOptions(ns))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil && ctx.Err() == nil {
				t.Errorf("simulator: %v", err)
			}
		})
	}}
}

// onEachBackend runs test once per backend, as subtests named after it,
// with env the backend's control plane while it runs.
func onEachBackend(t *testing.T, test func(t *testing.T, b *backend)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			saved := env
			env = b.env
			// Registered first, so it runs after the test's own cleanups,
			// which still use env.
			t.Cleanup(func() { env = saved })
			test(t, b)
		})
	}
}

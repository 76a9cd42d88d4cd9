package testenv

import (
	"context"
	"sync"
	"time"
)

// sharedStartTimeout bounds the first start of a Shared control plane;
// generous because a first run may build the binaries.
const sharedStartTimeout = 15 * time.Minute

// Shared is the control plane of a test package whose tests mostly need
// none: the first test that asks starts it, the others share it, and
// TestMain stops it. Keep one in a package variable.
type Shared struct {
	// Start starts the control plane; the context carries the deadline.
	Start func(ctx context.Context) (*Env, error)

	once sync.Once
	env  *Env
	err  error
}

// TB is the part of testing.TB that Shared uses (testenv does not import
// testing: capstan dev links this package).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Get returns the control plane, starting it on first use; a failed start
// fails every test that asks.
func (s *Shared) Get(t TB) *Env {
	t.Helper()
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), sharedStartTimeout)
		defer cancel()
		s.env, s.err = s.Start(ctx)
	})
	if s.err != nil {
		t.Fatalf("start the test control plane: %v", s.err)
	}
	return s.env
}

// Stop stops the control plane if a test started it.
func (s *Shared) Stop() error {
	if s.env == nil {
		return nil
	}
	return s.env.Stop()
}

package main

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// scripted is a devFollower that plays states: one per look.
type scripted struct {
	states []string // "ready", "stalled", or "" for walking
	at     int
	looks  atomic.Int32
}

func (s *scripted) look(context.Context) error {
	s.looks.Add(1)
	if s.at < len(s.states)-1 {
		s.at++
	}
	return nil
}
func (s *scripted) done() bool { return s.states[s.at] == "ready" }
func (s *scripted) stalled() error {
	if s.states[s.at] == "stalled" {
		return errors.New("mgmt stalled: bad file")
	}
	return nil
}
func (s *scripted) stuckError(cause error) error { return errors.New("stuck") }

// Without --exit-when-ready the loop follows through a stall and past
// Ready until it is stopped; with it, it ends at Ready or at a stall.
func TestDevFollowStaysUnlessAskedToExit(t *testing.T) {
	cases := []struct {
		name    string
		states  []string
		exit    bool
		wantErr string
		ready   int
	}{
		{"stall, fix, ready: keeps following", []string{"", "stalled", "stalled", "", "ready", "stalled", "ready"}, false, "", 1},
		{"stall with --exit-when-ready: the stall", []string{"", "stalled"}, true, "mgmt stalled: bad file", 0},
		{"ready with --exit-when-ready: exit 0", []string{"", "", "ready"}, true, "", 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &scripted{states: append([]string{""}, tc.states...)}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			ready := 0
			errc := make(chan error)
			done := make(chan error, 1)
			go func() {
				done <- follow(ctx, s, errc, followOptions{exitWhenReady: tc.exit, ready: func() { ready++ }})
			}()
			var err error
			if tc.exit {
				err = <-done
			} else {
				// It is still following once the script has played out.
				deadline := time.Now().Add(time.Minute)
				for int(s.looks.Load()) <= len(s.states)+2 && time.Now().Before(deadline) {
					select {
					case err = <-done:
						t.Fatalf("follow returned %v after %d looks, want it to keep following", err, s.looks.Load())
					case <-time.After(devPoll):
					}
				}
				cancel()
				err = <-done
			}
			if got := errString(err); got != tc.wantErr {
				t.Errorf("follow = %q, want %q", got, tc.wantErr)
			}
			if ready != tc.ready {
				t.Errorf("ready called %d times, want %d", ready, tc.ready)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

package main

import (
	"strings"
	"testing"
)

// A speed-up that is not a positive factor is refused before anything
// starts.
func TestDevRefusesBadSimSpeed(t *testing.T) {
	for _, speed := range []string{"0", "-2"} {
		_, err := runCLI(t, "dev", "--sim-speed", speed)
		if err == nil || !strings.Contains(err.Error(), "--sim-speed") || !strings.Contains(err.Error(), "positive") {
			t.Errorf("dev --sim-speed %s = %v, want an error naming the flag and what it wants", speed, err)
		}
	}
}

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

// A scenario other than mgmt and bootstrap, and the bootstrap scenario on
// the real providers (which cannot write a kubeconfig pointing at the
// second control plane), are refused before anything starts.
func TestDevRefusesBadScenario(t *testing.T) {
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"dev", "--scenario", "pivot"}, []string{"--scenario", `"pivot"`, "mgmt", "bootstrap"}},
		{[]string{"dev", "--scenario", "bootstrap", "--providers", "real"}, []string{"--scenario bootstrap", "simulated", "--providers real"}},
	}
	for _, tc := range cases {
		_, err := runCLI(t, tc.args...)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v = %v, want an error saying %q", tc.args, err, w)
			}
		}
	}
}

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// `capstan dev --dir` on a copy of examples/ whose five BareMetalHosts
// share one wrong value (bootMode Banana, in a namespace the first stage
// creates, so the preflight's schema check finds it) prints the stall as
// one line for the cause, counting the hosts and naming the file, not
// five lines of the same error.
func TestDevPrintsPreflightProblemsGroupedByCause(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second control plane")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	examples := copyExamples(t)
	hosts := filepath.Join(examples, devHostsFile)
	content, err := os.ReadFile(hosts)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(content), "bootMode: UEFI"); n != 5 {
		t.Fatalf("%s has %d hosts with bootMode UEFI, want the example's 5", devHostsFile, n)
	}
	if err := os.WriteFile(hosts, []byte(strings.ReplaceAll(string(content), "bootMode: UEFI", "bootMode: Banana")), 0o644); err != nil {
		t.Fatal(err)
	}

	d := startDev(ctx, t, "dev", "--dir", examples, "--sim-speed", "20")
	first := d.waitLine("the stall", func(l string) bool { return strings.Contains(l, "mgmt stalled at") })
	start := len(d.output()) - len(first) - 1
	d.waitLine("the end of the stall's message", func(l string) bool { return strings.Contains(l, "still following") })
	stall := d.output()[start:]
	t.Logf("capstan dev printed:\n%s", stall)
	for _, want := range []string{"ERROR 5 objects (BareMetalHost mgmt/mgmt-cp-0", "spec.bootMode", "clusters/mgmt/overlay/hosts.yaml"} {
		if !strings.Contains(stall, want) {
			t.Errorf("the stall does not say %q:\n%s", want, stall)
		}
	}
	if n := strings.Count(stall, "spec.bootMode"); n != 1 {
		t.Errorf("the stall names spec.bootMode %d times, want once for the one cause:\n%s", n, stall)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(); err != nil {
		t.Errorf("capstan dev after SIGTERM: %v", err)
	}
}

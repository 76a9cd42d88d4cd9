package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/stages"
)

// The README's demo, run as a user runs it: `capstan dev
// --exit-when-ready` starts its own control plane, serves examples/ from a
// local git repository, and exits 0 once the mgmt cluster is Ready, having
// printed every capm3 stage becoming ready, in order, and a table of their
// durations.
func TestDevExitsWhenTheExampleIsReady(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second control plane")
	}
	bin := capstanBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	begin := time.Now()
	dev := exec.CommandContext(ctx, bin, "dev", "--exit-when-ready", "--timeout", "3m", "--sim-speed", "10")
	dev.Dir = ".."
	out, err := dev.CombinedOutput()
	if err != nil {
		t.Fatalf("capstan dev: %v\n%s", err, out)
	}
	t.Logf("capstan dev --exit-when-ready --sim-speed 10: exit 0 after %s", time.Since(begin).Round(100*time.Millisecond))

	profile, err := stages.LoadProfile("capm3")
	if err != nil {
		t.Fatal(err)
	}
	text := string(out)
	at := 0
	for _, s := range profile.Stages {
		i := strings.Index(text[at:], "✓ mgmt "+s.Name)
		if i < 0 {
			t.Fatalf("output does not show %s becoming ready after the stages before it:\n%s", s.Name, out)
		}
		at += i
	}
	for _, want := range []string{"MGMT STAGE", "DURATION", "mgmt is Ready", "mgmt-lcm is Ready", "mgmt, mgmt-lcm Ready"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// A stage that cannot finish makes --exit-when-ready fail with that stage
// and its message, once --timeout passes.
func TestDevExitWhenReadyFailsWithTheStuckStage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second control plane")
	}
	bin := capstanBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Simulated providers a thousand times slower than the demo: hosts
	// never finish inspection within the timeout.
	dev := exec.CommandContext(ctx, bin, "dev", "--exit-when-ready", "--timeout", "15s", "--sim-speed", "0.001")
	dev.Dir = ".."
	out, err := dev.CombinedOutput()
	if err == nil {
		t.Fatalf("capstan dev exited 0 though the hosts could not register:\n%s", out)
	}
	if !strings.Contains(string(out), "stage HostsRegistered is InProgress") || !strings.Contains(string(out), "BareMetalHost") {
		t.Errorf("output does not name the stuck stage and what it waits for:\n%s", out)
	}
}

var built struct {
	once      sync.Once
	dir, path string
	err       error
}

// capstanBinary builds cmd/capstan once per test run.
func capstanBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "capstan-e2e-bin-")
		if err != nil {
			built.err = err
			return
		}
		built.dir, built.path = dir, filepath.Join(dir, "capstan")
		build := exec.Command("go", "build", "-o", built.path, "./cmd/capstan")
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

// `capstan dev --dir` reads a directory in place: the example's
// encrypted BMC credentials are live in plaintext, decrypted with the demo
// key; an edit to them (encrypted again) shows up as a new revision within
// a second, and the cluster is walked to Ready again at it with the new
// plaintext live. Ctrl-C then stops it, leaving nothing behind.
func TestDevDirShowsAnEditWithinASecond(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second control plane")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := copyExamples(t)
	d := startDev(ctx, t, "dev", "--dir", dir, "--sim-speed", "10")
	kubeconfig := devKubeconfigPath(d.waitLine("the export line", func(l string) bool { return strings.Contains(l, "export KUBECONFIG=") }))
	d.waitLine("every deployment Ready", func(l string) bool { return strings.Contains(l, "after start") })
	children := d.processes()
	// The example's BMC credentials are committed encrypted for the demo
	// key; dev made the key Secret, and the live Secret holds the plaintext.
	checkDevBMCPassword(ctx, t, kubeconfig, "mgmt-cp-0", "demo-password-mgmt-cp-0")

	// The edit an operator makes with `sops edit`: new passwords, the file
	// encrypted again.
	edited := time.Now()
	rewriteDevCredentials(t, dir, "rotated")
	d.waitLine("a new revision", func(l string) bool { return strings.Contains(l, "new revision") })
	seen := time.Since(edited)
	d.waitLine("Ready at the new revision", func(l string) bool { return strings.Contains(l, "mgmt is Ready at") })
	t.Logf("edit -> new revision shown in %s, Ready again in %s", seen.Round(time.Millisecond), time.Since(edited).Round(time.Millisecond))
	checkDevBMCPassword(ctx, t, kubeconfig, "mgmt-cp-0", "rotated-mgmt-cp-0")

	if err := d.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(); err != nil {
		t.Errorf("capstan dev after Ctrl-C: %v\n%s", err, d.output())
	}
	d.checkNothingLeft(children)
}

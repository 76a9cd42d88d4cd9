package promserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Binaries are the paths of the Prometheus tools.
type Binaries struct {
	Promtool   string
	Prometheus string
}

// debianPackage ships both promtool and prometheus.
const debianPackage = "prometheus"

// Find returns the tools from $PATH (or /usr/bin, where Debian puts them).
func Find() (Binaries, error) {
	var b Binaries
	var errs []error
	for _, t := range []struct {
		name string
		path *string
	}{{"promtool", &b.Promtool}, {"prometheus", &b.Prometheus}} {
		p, err := exec.LookPath(t.name)
		if err != nil {
			if _, statErr := os.Stat(filepath.Join("/usr/bin", t.name)); statErr == nil {
				p, err = filepath.Join("/usr/bin", t.name), nil
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("find %s: %w", t.name, err))
			continue
		}
		*t.path = p
	}
	return b, errors.Join(errs...)
}

// EnsureInstalled returns the tools, first installing Debian's prometheus
// package with apt-get when one is missing (as `make tools` does). That
// needs root and apt; without them it returns an error that says what to
// install. Concurrent callers (test packages run in parallel) take turns.
func EnsureInstalled(ctx context.Context, progress io.Writer) (Binaries, error) {
	if progress == nil {
		progress = io.Discard
	}
	if b, err := Find(); err == nil {
		return b, nil
	}
	unlock, err := lock(ctx, filepath.Join(os.TempDir(), "capstan-prometheus-install.lock"))
	if err != nil {
		return Binaries{}, err
	}
	defer unlock()
	// Another caller may have installed it while this one waited.
	if b, err := Find(); err == nil {
		return b, nil
	}
	if err := install(ctx, progress); err != nil {
		return Binaries{}, fmt.Errorf("promtool and prometheus are missing and could not be installed: %w; install Debian's %s package (make tools)", err, debianPackage)
	}
	return Find()
}

func install(ctx context.Context, progress io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("not root")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("no apt-get: %w", err)
	}
	fmt.Fprintf(progress, "promserver: installing Debian's %s package\n", debianPackage)
	if err := run(ctx, progress, nil, "apt-get", "update"); err != nil {
		return err
	}
	// apt-cache policy tells, after the update, whether any source offers it.
	var policy bytes.Buffer
	if err := run(ctx, &policy, nil, "apt-cache", "policy", debianPackage); err != nil {
		return err
	}
	if !strings.Contains(policy.String(), "Candidate:") || strings.Contains(policy.String(), "Candidate: (none)") {
		return fmt.Errorf("no apt source offers %s:\n%s", debianPackage, policy.String())
	}
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	return run(ctx, progress, env, "apt-get", "install", "-y", "--no-install-recommends", debianPackage)
}

func run(ctx context.Context, out io.Writer, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Env = out, io.MultiWriter(out, &stderr), env
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

package testenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// KubernetesVersion is the version of the binaries EnsureBinaries looks for
// when e2e/testbin cannot be found. It must match k8s.io/kubernetes in
// e2e/testbin/go.mod, which a test checks.
const KubernetesVersion = "v1.35.4"

// binDirEnv overrides the directory of the binaries, as in build.sh.
const binDirEnv = "CAPSTAN_TESTBIN_DIR"

// binaries are the files EnsureBinaries requires.
var binaries = []string{etcdName, apiServerName, controllerManagerName, schedulerName, kubeletName}

// buildScript is where build.sh lives relative to the repository root.
var buildScript = filepath.Join("e2e", "testbin", "build.sh")

// EnsureBinaries returns the directory holding etcd, kube-apiserver and
// kube-controller-manager. It uses $CAPSTAN_TESTBIN_DIR or the cache
// directory of e2e/testbin/build.sh if all three are there, and otherwise
// runs build.sh, which takes minutes, streaming its progress to progress
// (nil discards it). Concurrent callers, such as test packages run in
// parallel by `go test ./...`, take turns so only one builds.
func EnsureBinaries(ctx context.Context, progress io.Writer) (string, error) {
	if progress == nil {
		progress = io.Discard
	}
	script, scriptErr := findBuildScript()
	version := KubernetesVersion
	if scriptErr == nil {
		v, err := testbinVersion(filepath.Join(filepath.Dir(script), "go.mod"))
		if err != nil {
			return "", err
		}
		version = v
	}
	dir, err := binCacheDir(version)
	if err != nil {
		return "", err
	}
	if missing := missingBinaries(dir); len(missing) == 0 {
		return dir, nil
	} else if scriptErr != nil {
		return "", fmt.Errorf("find test binaries: %s missing in %s and %w; build them with `make testbin` (e2e/testbin/build.sh) or point %s at a directory holding them",
			strings.Join(missing, ", "), dir, scriptErr, binDirEnv)
	}

	unlock, err := lockDir(ctx, filepath.Dir(dir), progress)
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have built them while we waited for the lock.
	if len(missingBinaries(dir)) == 0 {
		return dir, nil
	}
	return runBuildScript(ctx, script, progress)
}

// runBuildScript runs build.sh and returns the directory it prints last.
func runBuildScript(ctx context.Context, script string, progress io.Writer) (string, error) {
	fmt.Fprintf(progress, "testenv: building test binaries with %s (takes minutes the first time)\n", script)
	dir, err := runScript(ctx, script, progress)
	if err != nil {
		return "", fmt.Errorf("build test binaries: %w", err)
	}
	if missing := missingBinaries(dir); len(missing) > 0 {
		return "", fmt.Errorf("build test binaries with %s: %s missing in %s afterwards", script, strings.Join(missing, ", "), dir)
	}
	return dir, nil
}

// scriptWaitDelay bounds how long a cancelled build script's output is
// read after it was killed.
const scriptWaitDelay = 10 * time.Second

// runScript runs a build script that prints the directory it filled as its
// last line on stdout, streaming its stderr to progress.
func runScript(ctx context.Context, script string, progress io.Writer) (string, error) {
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stdout = &stdout
	cmd.Stderr = progress
	// A cancelled build stops whole: killing bash alone would leave its
	// go build running, holding the output pipe, so Wait would not return
	// until that build finished.
	cmd.SysProcAttr = groupProcAttr()
	cmd.Cancel = func() error { return killGroup(cmd.Process) }
	cmd.WaitDelay = scriptWaitDelay
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("run %s: %w", script, err)
	}
	out := strings.TrimSpace(stdout.String())
	dir := strings.TrimSpace(out[strings.LastIndex(out, "\n")+1:])
	if dir == "" {
		return "", fmt.Errorf("run %s: it printed no directory", script)
	}
	return dir, nil
}

// binCacheDir mirrors build.sh:
// ${CAPSTAN_TESTBIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capstan/testbin/<version>}.
func binCacheDir(version string) (string, error) {
	if dir := os.Getenv(binDirEnv); dir != "" {
		return dir, nil
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("find test binary cache: %w", err)
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "capstan", "testbin", version), nil
}

// missingBinaries lists the binaries that are not executable files in dir.
func missingBinaries(dir string) []string {
	var missing []string
	for _, name := range binaries {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	return missing
}

// findBuildScript looks for e2e/testbin/build.sh above the working directory
// (go test runs in the package directory) and above this source file.
func findBuildScript() (string, error) {
	return findRepoFile(buildScript)
}

// testbinVersion reads the k8s.io/kubernetes version from the go.mod of
// e2e/testbin, which names build.sh's cache directory.
func testbinVersion(goMod string) (string, error) {
	f, err := os.Open(goMod)
	if err != nil {
		return "", fmt.Errorf("read test binary version: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if fields = trimRequire(fields); len(fields) >= 2 && fields[0] == "k8s.io/kubernetes" {
			return fields[1], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read test binary version from %s: %w", goMod, err)
	}
	return "", fmt.Errorf("read test binary version: %s does not require k8s.io/kubernetes", goMod)
}

// trimRequire drops a leading "require" from a single-line requirement.
func trimRequire(fields []string) []string {
	if len(fields) > 0 && fields[0] == "require" {
		return fields[1:]
	}
	return fields
}

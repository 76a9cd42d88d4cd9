package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// providerGoMod is where the provider versions are pinned, relative to the
// repository root. It is the one place they are written.
var providerGoMod = filepath.Join("e2e", "crds", "go.mod")

// ProviderModule is a Go module whose own CustomResourceDefinitions the
// tests install, and the folders inside it that hold them.
type ProviderModule struct {
	// Path is the module path.
	Path string
	// CRDDirs are folders of CRD YAML, relative to the module root.
	CRDDirs []string
}

// ProviderModules are the Cluster API and Metal3 modules whose CRDs make a
// management cluster: CAPI core, kubeadm bootstrap and control plane,
// CAPM3, the BareMetal Operator and the Metal3 IP address manager. Their
// versions come from e2e/crds/go.mod.
var ProviderModules = []ProviderModule{
	{Path: "sigs.k8s.io/cluster-api", CRDDirs: []string{
		"core/config/crd/bases",
		"bootstrap/kubeadm/config/crd/bases",
		"controlplane/kubeadm/config/crd/bases",
	}},
	{Path: "github.com/metal3-io/cluster-api-provider-metal3", CRDDirs: []string{"config/crd/bases"}},
	{Path: "github.com/metal3-io/baremetal-operator", CRDDirs: []string{"config/base/crds/bases"}},
	{Path: "github.com/metal3-io/ip-address-manager", CRDDirs: []string{"config/crd/bases"}},
}

// metal3NoSumDB is added to GONOSUMDB: the metal3-io modules are not in
// the public checksum database under the pinned versions; e2e/crds/go.sum
// holds their hashes instead.
const metal3NoSumDB = "github.com/metal3-io"

// ProviderCRDDirs returns the CRD folders of ProviderModules in the Go
// module cache, downloading the modules at the versions pinned in
// e2e/crds/go.mod with `go mod download` the first time. Once they are in
// the module cache it needs no network: go.sum in e2e/crds holds every
// hash. Pass the folders to InstallCRDs or Options.CRDDirs.
func ProviderCRDDirs(ctx context.Context) ([]string, error) {
	goMod, err := findRepoFile(providerGoMod)
	if err != nil {
		return nil, fmt.Errorf("find provider CRDs: %w", err)
	}
	versions, err := requiredVersions(goMod)
	if err != nil {
		return nil, fmt.Errorf("find provider CRDs: %w", err)
	}
	args := make([]string, 0, len(ProviderModules))
	var errs []error
	for _, m := range ProviderModules {
		v, ok := versions[m.Path]
		if !ok {
			errs = append(errs, fmt.Errorf("%s does not require %s (was it tidied away? no code imports it)", goMod, m.Path))
			continue
		}
		args = append(args, m.Path+"@"+v)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("find provider CRDs: %w", errors.Join(errs...))
	}
	roots, err := downloadModules(ctx, filepath.Dir(goMod), args)
	if err != nil {
		return nil, fmt.Errorf("find provider CRDs: %w", err)
	}
	var dirs []string
	for _, m := range ProviderModules {
		root := roots[m.Path]
		for _, d := range m.CRDDirs {
			dir := filepath.Join(root, filepath.FromSlash(d))
			if st, err := os.Stat(dir); err != nil || !st.IsDir() {
				errs = append(errs, fmt.Errorf("%s@%s has no folder %s", m.Path, versions[m.Path], d))
				continue
			}
			dirs = append(dirs, dir)
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("find provider CRDs: %w", errors.Join(errs...))
	}
	return dirs, nil
}

// moduleDownload is what `go mod download -json` prints for one module.
type moduleDownload struct {
	Path    string
	Version string
	Dir     string
	Error   string
}

// downloadModules runs `go mod download -json` for the module@version args
// in dir and returns each module's folder in the module cache.
func downloadModules(ctx context.Context, dir string, args []string) (map[string]string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("download %s: the go command is needed: %w", strings.Join(args, " "), err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, goBin, append([]string{"mod", "download", "-json"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GONOSUMDB="+joinList(os.Getenv("GONOSUMDB"), metal3NoSumDB),
		// The versions are e2e/crds/go.mod's; no flag of the caller's
		// (-mod=vendor, -mod=readonly) applies to that module.
		"GOFLAGS=-mod=mod",
		// A go.work above the repository must not decide the versions.
		"GOWORK=off",
	)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Cancelled, go stops with what it started (git for a module not in
	// the cache), as a build script does.
	cmd.SysProcAttr = groupProcAttr()
	cmd.Cancel = func() error { return killGroup(cmd.Process) }
	cmd.WaitDelay = scriptWaitDelay
	runErr := cmd.Run()
	// go mod download reports a module it cannot fetch in its JSON and
	// exits non-zero: read the JSON first, it names the module.
	roots := map[string]string{}
	var errs []error
	dec := json.NewDecoder(&stdout)
	for {
		var m moduleDownload
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			errs = append(errs, fmt.Errorf("read go mod download output: %w", err))
			break
		}
		if m.Error != "" {
			errs = append(errs, fmt.Errorf("download %s@%s: %s", m.Path, m.Version, m.Error))
			continue
		}
		roots[m.Path] = m.Dir
	}
	if runErr != nil && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("go mod download in %s: %w: %s", dir, runErr, strings.TrimSpace(stderr.String())))
	}
	for _, a := range args {
		path, _, _ := strings.Cut(a, "@")
		if _, ok := roots[path]; !ok && len(errs) == 0 {
			errs = append(errs, fmt.Errorf("go mod download in %s did not report %s", dir, a))
		}
	}
	return roots, errors.Join(errs...)
}

// joinList appends item to a comma-separated Go environment list.
func joinList(list, item string) string {
	if strings.TrimSpace(list) == "" {
		return item
	}
	return list + "," + item
}

// requiredVersions reads the require directives of a go.mod: module path
// to version. It understands the one-line and the block form, which is all
// e2e/crds/go.mod uses.
func requiredVersions(goMod string) (map[string]string, error) {
	f, err := os.Open(goMod)
	if err != nil {
		return nil, fmt.Errorf("read pinned versions: %w", err)
	}
	defer f.Close()
	versions := map[string]string{}
	inBlock := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "//")
		fields := strings.Fields(line)
		switch {
		case len(fields) == 0:
		case inBlock && fields[0] == ")":
			inBlock = false
		case inBlock && len(fields) >= 2:
			versions[fields[0]] = fields[1]
		case fields[0] == "require" && len(fields) == 2 && fields[1] == "(":
			inBlock = true
		case fields[0] == "require" && len(fields) >= 3:
			versions[fields[1]] = fields[2]
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read pinned versions from %s: %w", goMod, err)
	}
	return versions, nil
}

// findRepoFile looks for rel (a path from the repository root) above the
// working directory (go test runs in the package directory) and above this
// source file.
func findRepoFile(rel string) (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	for _, start := range starts {
		for dir := start; ; dir = filepath.Dir(dir) {
			p := filepath.Join(dir, rel)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				return p, nil
			}
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	return "", fmt.Errorf("no %s above %s: %w", rel, strings.Join(starts, " or "), fs.ErrNotExist)
}

// RepoRoot returns the root of the Capstan checkout this process runs in
// (found from the working directory or this source file): `capstan dev`
// and the tests read the CRDs, the examples and the test-binary build from
// it.
func RepoRoot() (string, error) {
	goMod, err := findRepoFile(providerGoMod)
	if err != nil {
		return "", err
	}
	return filepath.Dir(filepath.Dir(filepath.Dir(goMod))), nil
}

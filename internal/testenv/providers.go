package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// The real Cluster API and Metal3 controllers (Options.Providers): built
// from their Go modules by e2e/providers/build.sh, started as processes
// against the env's API server, with their webhooks on 127.0.0.1.

// providersDirEnv overrides the directory of the provider binaries, as in
// e2e/providers/build.sh.
const providersDirEnv = "CAPSTAN_PROVIDERS_DIR"

// providersScript is where the providers' build script lives relative to
// the repository root.
var providersScript = filepath.Join("e2e", "providers", "build.sh")

// providerPorts are the loopback ports one provider process listens on.
type providerPorts struct {
	webhook, health, metrics int
}

// Provider is one controller manager of Cluster API or Metal3 that
// Options.Providers runs.
type Provider struct {
	// Name is the binary's name in the providers' cache and the name of
	// its log file.
	Name string
	// Module is the Go module whose CRDs and webhook manifests the
	// process serves; its version is the one e2e/crds/go.mod pins.
	Module string
	// CRDDir is the folder of the CRDs this process converts, relative to
	// the module root. Its parent holds the kustomization that enables the
	// conversion webhooks, and webhook/manifests.yaml two levels up the
	// admission webhooks.
	CRDDir string

	// command returns the process's flags and the environment it adds,
	// given its ports and the folder holding tls.crt and tls.key.
	command func(e *Env, ports providerPorts, certDir string) (args, env []string)
}

// Providers are the controllers Options.Providers starts, in start order:
// the BareMetal Operator and IPAM first (nothing of theirs waits on
// another provider), then Cluster API's core, bootstrap and control-plane
// managers, then CAPM3.
var Providers = []Provider{
	{Name: "baremetal-operator", Module: "github.com/metal3-io/baremetal-operator", CRDDir: "config/base/crds/bases", command: bmoCommand},
	{Name: "ipam-manager", Module: "github.com/metal3-io/ip-address-manager", CRDDir: "config/crd/bases", command: managerCommand},
	{Name: "cluster-api-manager", Module: "sigs.k8s.io/cluster-api", CRDDir: "core/config/crd/bases", command: managerCommand},
	{Name: "kubeadm-bootstrap-manager", Module: "sigs.k8s.io/cluster-api", CRDDir: "bootstrap/kubeadm/config/crd/bases", command: managerCommand},
	{Name: "kubeadm-control-plane-manager", Module: "sigs.k8s.io/cluster-api", CRDDir: "controlplane/kubeadm/config/crd/bases", command: managerCommand},
	{Name: "capm3-manager", Module: "github.com/metal3-io/cluster-api-provider-metal3", CRDDir: "config/crd/bases", command: managerCommand},
}

// EnsureProviders returns the directory holding the binaries of Providers,
// building them with e2e/providers/build.sh the first time (minutes),
// streaming its progress to progress.
func EnsureProviders(ctx context.Context, progress io.Writer) (string, error) {
	if progress == nil {
		progress = io.Discard
	}
	if dir := os.Getenv(providersDirEnv); dir != "" && len(missingProviders(dir)) == 0 {
		return dir, nil
	}
	script, err := findRepoFile(providersScript)
	if err != nil {
		return "", fmt.Errorf("find provider binaries: %w; set %s to a directory holding %s", err, providersDirEnv, strings.Join(providerNames(), ", "))
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("find provider binaries: %w", err)
	}
	lockParent := filepath.Join(cache, "capstan", "providers")
	if err := os.MkdirAll(lockParent, 0o755); err != nil {
		return "", fmt.Errorf("find provider binaries: %w", err)
	}
	unlock, err := lockDir(ctx, lockParent, progress)
	if err != nil {
		return "", err
	}
	defer unlock()
	// build.sh is quick when everything is cached: it only reads go.mod
	// files and checks the files.
	fmt.Fprintf(progress, "testenv: provider binaries from %s (minutes the first time)\n", script)
	dir, err := runScript(ctx, script, progress)
	if err != nil {
		return "", fmt.Errorf("build provider binaries: %w", err)
	}
	if missing := missingProviders(dir); len(missing) > 0 {
		return "", fmt.Errorf("build provider binaries: %s did not leave %s in %s", script, strings.Join(missing, ", "), dir)
	}
	return dir, nil
}

// workloadClustersName is Capstan's own stand-in for the machines and the
// workload clusters' API servers (e2e/providers/capi/cmd/workload-clusters).
const workloadClustersName = "workload-clusters"

// providerNames are the binaries EnsureProviders provides.
func providerNames() []string {
	names := make([]string, 0, len(Providers)+1)
	for _, p := range Providers {
		names = append(names, p.Name)
	}
	return append(names, workloadClustersName)
}

func missingProviders(dir string) []string {
	var missing []string
	for _, name := range providerNames() {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	return missing
}

// providerModuleRoots returns each provider module's folder in the module
// cache, at the versions e2e/crds/go.mod pins.
func providerModuleRoots(ctx context.Context) (map[string]string, error) {
	goMod, err := findRepoFile(providerGoMod)
	if err != nil {
		return nil, err
	}
	versions, err := requiredVersions(goMod)
	if err != nil {
		return nil, err
	}
	var args []string
	var errs []error
	seen := map[string]bool{}
	for _, p := range Providers {
		if seen[p.Module] {
			continue
		}
		seen[p.Module] = true
		v, ok := versions[p.Module]
		if !ok {
			errs = append(errs, fmt.Errorf("%s does not require %s", goMod, p.Module))
			continue
		}
		args = append(args, p.Module+"@"+v)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return downloadModules(ctx, filepath.Dir(goMod), args)
}

package testenv

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// installProviderCRDs installs the provider CRDs into env once for the
// tests that need them. The first run may download the modules.
var installProviderCRDs = sync.OnceValues(func() ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dirs, err := ProviderCRDDirs(ctx)
	if err != nil {
		return nil, err
	}
	return dirs, InstallCRDs(ctx, env.Config, dirs...)
})

func providerCRDs(t *testing.T) []string {
	t.Helper()
	dirs, err := installProviderCRDs()
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// TestProviderCRDDirs: every folder is in the module cache at the version
// e2e/crds/go.mod pins, and holds CRDs.
func TestProviderCRDDirs(t *testing.T) {
	dirs := providerCRDs(t)
	goMod, err := findRepoFile(providerGoMod)
	if err != nil {
		t.Fatal(err)
	}
	versions, err := requiredVersions(goMod)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, m := range ProviderModules {
		want += len(m.CRDDirs)
		at := filepath.FromSlash(m.Path) + "@" + versions[m.Path]
		if !slices.ContainsFunc(dirs, func(d string) bool { return strings.Contains(d, at) }) {
			t.Errorf("no folder of %s in %v", at, dirs)
		}
	}
	if len(dirs) != want {
		t.Errorf("ProviderCRDDirs = %d folders, want %d: %v", len(dirs), want, dirs)
	}
	for _, d := range dirs {
		docs, err := readCRDs([]string{d})
		if err != nil {
			t.Errorf("read %s: %v", d, err)
		}
		if len(docs) == 0 {
			t.Errorf("%s holds no CRD", d)
		}
	}
}

// TestProviderCRDDirsOffline: once the modules are in the module cache,
// finding them needs no network (the proxy is switched off here).
func TestProviderCRDDirsOffline(t *testing.T) {
	providerCRDs(t) // downloads them if this is the first run
	t.Setenv("GOPROXY", "off")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := ProviderCRDDirs(ctx); err != nil {
		t.Fatalf("ProviderCRDDirs with GOPROXY=off: %v", err)
	}
}

// TestProviderCRDsServed installs the real CRDs and checks that the
// kinds a Metal3 cluster is made of are served in the versions the
// built-in profiles are written for.
func TestProviderCRDsServed(t *testing.T) {
	providerCRDs(t)
	disco, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	kinds := []schema.GroupVersionKind{
		{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Cluster"},
		{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Machine"},
		{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "MachineDeployment"},
		{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta2", Kind: "KubeadmControlPlane"},
		{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta2", Kind: "KubeadmConfigTemplate"},
		{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "Metal3Cluster"},
		{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "Metal3Machine"},
		{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "Metal3MachineTemplate"},
		{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "Metal3DataTemplate"},
		{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "Metal3Data"},
		{Group: "metal3.io", Version: "v1alpha1", Kind: "BareMetalHost"},
		{Group: "ipam.metal3.io", Version: "v1alpha1", Kind: "IPPool"},
	}
	for _, gvk := range kinds {
		list, err := disco.ServerResourcesForGroupVersion(gvk.GroupVersion().String())
		if err != nil {
			t.Errorf("discover %s: %v", gvk.GroupVersion(), err)
			continue
		}
		if !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Kind == gvk.Kind }) {
			t.Errorf("%s is not served", gvk)
		}
	}

	// The schema is the real one: a Cluster as a user writes it is
	// stored, one with an unknown field in a structural schema is pruned.
	ns, err := env.CreateNamespace(t.Context(), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = rest.NoWarnings{} // the unknown field below is on purpose
	clusters := dynamic.NewForConfigOrDie(cfg).Resource(schema.GroupVersionResource{
		Group: "cluster.x-k8s.io", Version: "v1beta2", Resource: "clusters",
	}).Namespace(ns)
	cluster := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cluster.x-k8s.io/v1beta2",
		"kind":       "Cluster",
		"metadata":   map[string]any{"name": "mgmt"},
		"spec": map[string]any{
			"clusterNetwork": map[string]any{"pods": map[string]any{"cidrBlocks": []any{"10.233.0.0/16"}}},
			"infrastructureRef": map[string]any{
				"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Cluster", "name": "mgmt",
			},
			"notAField": true,
		},
	}}
	got, err := clusters.Create(t.Context(), cluster, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Cluster: %v", err)
	}
	if _, found, _ := unstructured.NestedFieldNoCopy(got.Object, "spec", "notAField"); found {
		t.Error("unknown field kept: the CRD schema is not structural")
	}
}

func TestRequiredVersions(t *testing.T) {
	goMod := filepath.Join(t.TempDir(), "go.mod")
	content := `module example.com/m // comment

go 1.26

require example.com/single v1.0.0

require (
	// a comment line
	example.com/a v1.2.3
	example.com/b v0.1.0 // indirect
)
`
	if err := os.WriteFile(goMod, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := requiredVersions(goMod)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"example.com/single": "v1.0.0", "example.com/a": "v1.2.3", "example.com/b": "v0.1.0"}
	if len(got) != len(want) {
		t.Errorf("requiredVersions = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("requiredVersions[%s] = %q, want %q", k, got[k], v)
		}
	}
}

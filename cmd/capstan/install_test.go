package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// TestInstallExportPrintsWhatInstallApplies checks `capstan install
// --export`: the manifests with the flags applied, as YAML documents that
// parse, and a patch file that names nothing is refused.
func TestInstallExportPrintsWhatInstallApplies(t *testing.T) {
	patch := filepath.Join(t.TempDir(), "patch.yaml")
	if err := os.WriteFile(patch, []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: capstan}\nspec: {template: {spec: {priorityClassName: system-cluster-critical}}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runCapstan(t, "install", "--export", "--image", "registry.example/capstan:v9", "--source", "https://git.example/infra.git", "--patch", patch)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	kinds := map[string]int{}
	var deployment *unstructured.Unstructured
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); err != nil {
			break
		}
		if obj.Object == nil {
			continue
		}
		kinds[obj.GetKind()]++
		if obj.GetKind() == "Deployment" {
			deployment = obj
		}
	}
	for kind, want := range map[string]int{"CustomResourceDefinition": 3, "Namespace": 1, "Deployment": 1, "ClusterRole": 5, "ServiceAccount": 1} {
		if kinds[kind] != want {
			t.Errorf("%d %s in the export, want %d (all: %v)", kinds[kind], kind, want, kinds)
		}
	}
	if deployment == nil {
		t.Fatal("no Deployment")
	}
	if !strings.Contains(out, "image: registry.example/capstan:v9") || !strings.Contains(out, "priorityClassName: system-cluster-critical") {
		t.Errorf("the export lacks the image or the patch:\n%s", out)
	}

	if err := os.WriteFile(patch, []byte("apiVersion: v1\nkind: Service\nmetadata: {name: typo}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runCapstan(t, "install", "--export", "--patch", patch); err == nil || !strings.Contains(err.Error(), `no Service "typo"`) {
		t.Errorf("a patch of nothing: err %v, want one naming it", err)
	}
}

// TestInstallTenancyExportsTheMultiTenantInstall: --tenancy adds the
// component: the daemon's --default-service-account, the tenant role, and
// no cluster-wide binding of capstan-namespace.
func TestInstallTenancyExportsTheMultiTenantInstall(t *testing.T) {
	out, err := runCapstan(t, "install", "--export", "--tenancy")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--default-service-account=capstan-deployer", "name: capstan-tenant", "kind: RoleBinding\nmetadata:\n  labels:\n    app.kubernetes.io/part-of: capstan\n  name: capstan-namespace"} {
		if !strings.Contains(out, want) {
			t.Errorf("the --tenancy export lacks %q", want)
		}
	}
	if strings.Contains(out, "kind: ClusterRoleBinding\nmetadata:\n  labels:\n    app.kubernetes.io/part-of: capstan\n  name: capstan-namespace\n") {
		t.Error("the --tenancy export binds capstan-namespace cluster-wide")
	}
}

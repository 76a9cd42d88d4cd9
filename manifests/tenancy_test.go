package manifests_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/capstan-dev/capstan/manifests"
)

// id names an object as the API server does.
func id(o *unstructured.Unstructured) string {
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// The component works the way the docs tell a kubectl user to use it: an
// overlay of one's own that lists manifests/ as a resource and
// components/tenancy as a component builds (kubectl apply -k) the same
// RBAC and Deployment arguments as `capstan install --tenancy`.
func TestTenancyComponentInAnOverlayIsWhatInstallTenancyApplies(t *testing.T) {
	dir := t.TempDir()
	err := fs.WalkDir(manifests.Kustomization, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(manifests.Kustomization, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dir, "capstan", "manifests", p)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(dir, "platform")
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../capstan/manifests]\ncomponents: [../capstan/manifests/" + manifests.TenancyComponent + "]\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(&krusty.Options{LoadRestrictions: types.LoadRestrictionsRootOnly, PluginConfig: types.DisabledPluginConfig()}).
		Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("kustomize build of an overlay with the component: %v", err)
	}
	built := map[string]map[string]any{}
	for _, r := range m.Resources() {
		// Through JSON, as manifests.Objects does: numbers as int64.
		data, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(data); err != nil {
			t.Fatal(err)
		}
		built[id(u)] = u.Object
	}
	installed, err := manifests.Objects(manifests.Options{Tenancy: true})
	if err != nil {
		t.Fatal(err)
	}
	rbac := 0
	for _, o := range installed {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			rbac++
			if got, ok := built[id(o)]; !ok {
				t.Errorf("the overlay lacks %s", id(o))
			} else if !reflect.DeepEqual(got, o.Object) {
				t.Errorf("%s differs:\noverlay: %v\ninstall: %v", id(o), got, o.Object)
			}
		case "Deployment":
			got := toStrings(container(t, []*unstructured.Unstructured{{Object: built[id(o)]}})["args"])
			want := toStrings(container(t, installed)["args"])
			if !slices.Equal(got, want) {
				t.Errorf("Deployment args: overlay %q, install %q", got, want)
			}
			if !slices.Contains(want, "--default-service-account="+manifests.DefaultTenantServiceAccount) {
				t.Errorf("the multi-tenant Deployment's args %q lack --default-service-account=%s", want, manifests.DefaultTenantServiceAccount)
			}
		}
	}
	for key, obj := range built {
		u := &unstructured.Unstructured{Object: obj}
		if !slices.ContainsFunc(installed, func(o *unstructured.Unstructured) bool { return id(o) == key }) && u.GetKind() != "ConfigMap" {
			t.Errorf("the overlay has %s, which capstan install --tenancy does not", key)
		}
	}
	if rbac == 0 {
		t.Fatal("no RBAC in the install")
	}
}

// Switching an install to --tenancy deletes the plain install's
// cluster-wide bindings (server-side apply never deletes), and switching
// back deletes the tenancy's roles; nothing but RBAC is a leftover.
func TestLeftoversOfTheOtherInstall(t *testing.T) {
	ids := func(tenancy bool) []string {
		objs, err := manifests.Leftovers(manifests.Options{Namespace: "capstan", Tenancy: tenancy})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, o := range objs {
			out = append(out, id(o))
		}
		slices.Sort(out)
		return out
	}
	if got, want := ids(true), []string{"ClusterRoleBinding /capstan-namespace"}; !slices.Equal(got, want) {
		t.Errorf("leftovers of a plain install under --tenancy: %q, want %q", got, want)
	}
	want := []string{
		"ClusterRole /capstan-tenant",
		"ClusterRoleBinding /capstan-deployer-apply",
		"ClusterRoleBinding /capstan-deployer-secrets",
		"RoleBinding capstan/capstan-namespace",
		"ServiceAccount capstan/capstan-deployer",
	}
	if got := ids(false); !slices.Equal(got, want) {
		t.Errorf("leftovers of a multi-tenant install under a plain one: %q, want %q", got, want)
	}
}

package manifests_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/types"

	"github.com/capstan-dev/capstan/manifests"
)

// find returns the object of kind named name (a generated ConfigMap's name
// has a hash suffix).
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && (o.GetName() == name || strings.HasPrefix(o.GetName(), name+"-")) {
			return o
		}
	}
	t.Fatalf("no %s %s in the install manifests", kind, name)
	return nil
}

func str(t *testing.T, o *unstructured.Unstructured, fields ...string) string {
	t.Helper()
	v, _, err := unstructured.NestedFieldNoCopy(o.Object, fields...)
	if err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
	s, _ := v.(string)
	return s
}

// container returns the Deployment's one container.
func container(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	d := find(t, objs, "Deployment", "capstan")
	cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("Deployment has %d containers, want 1", len(cs))
	}
	return cs[0].(map[string]any)
}

func TestObjectsDefaults(t *testing.T) {
	objs, err := manifests.Objects(manifests.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if objs[0].GetKind() != "Namespace" || objs[0].GetName() != "capstan-system" {
		t.Errorf("first object is %s %s, want Namespace capstan-system", objs[0].GetKind(), objs[0].GetName())
	}
	for _, o := range objs {
		if o.GetLabels()["app.kubernetes.io/part-of"] != "capstan" {
			t.Errorf("%s %s has no app.kubernetes.io/part-of=capstan label", o.GetKind(), o.GetName())
		}
	}
	c := container(t, objs)
	if c["image"] != "ghcr.io/capstan-dev/capstan:latest" {
		t.Errorf("image %v, want the one kustomization.yaml names", c["image"])
	}
	args := strings.Join(toStrings(c["args"]), " ")
	for _, want := range []string{"run", "--leader-elect=true", "--source=$(CAPSTAN_SOURCE)"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	d := find(t, objs, "Deployment", "capstan")
	if hn, _, _ := unstructured.NestedBool(d.Object, "spec", "template", "spec", "hostNetwork"); hn {
		t.Error("hostNetwork is on by default")
	}
	cm := find(t, objs, "ConfigMap", "capstan-source")
	if got := str(t, cm, "data", "CAPSTAN_SOURCE"); got != "" {
		t.Errorf("default root source %q, want none", got)
	}
	envFrom := toMaps(c["envFrom"])
	if name, _, _ := unstructured.NestedString(envFrom[0], "configMapRef", "name"); name != cm.GetName() {
		t.Errorf("Deployment reads ConfigMap %q, want the generated %q", name, cm.GetName())
	}
}

func TestObjectsOptions(t *testing.T) {
	objs, err := manifests.Objects(manifests.Options{
		Image:     "127.0.0.1:5000/capstan:v1.2.3",
		Namespace: "ops",
		Source:    manifests.Source{URL: "https://git.example/infra.git", Branch: "prod", Username: "bot", Interval: "10s"},
		Replicas:  2, HostNetwork: true, APIServer: "127.0.0.1:6443",
		MetricsPort: 18080, HealthPort: 18081,
		Patches: []types.Patch{{Patch: "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: capstan}\nspec: {template: {metadata: {annotations: {team: infra}}}}"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetNamespace() != "" && o.GetNamespace() != "ops" {
			t.Errorf("%s %s is in namespace %q, want ops", o.GetKind(), o.GetName(), o.GetNamespace())
		}
	}
	find(t, objs, "Namespace", "ops")
	for _, o := range objs {
		if o.GetKind() == "Namespace" && o.GetName() != "ops" {
			t.Errorf("Namespace %s installed besides ops", o.GetName())
		}
		if o.GetKind() == "ClusterRoleBinding" || o.GetKind() == "RoleBinding" {
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, s := range subjects {
				if ns := s.(map[string]any)["namespace"]; ns != "ops" {
					t.Errorf("%s %s binds a ServiceAccount in namespace %v, want ops", o.GetKind(), o.GetName(), ns)
				}
			}
		}
	}
	c := container(t, objs)
	if c["image"] != "127.0.0.1:5000/capstan:v1.2.3" {
		t.Errorf("image %v", c["image"])
	}
	args := strings.Join(toStrings(c["args"]), " ")
	for _, want := range []string{"--metrics-addr=:18080", "--health-addr=:18081"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
	ports := toMaps(c["ports"])
	if ports[0]["containerPort"] != int64(18080) || ports[1]["containerPort"] != int64(18081) {
		t.Errorf("ports %v, want 18080 and 18081", ports)
	}
	env := map[string]any{}
	for _, e := range toMaps(c["env"]) {
		env[e["name"].(string)] = e["value"]
	}
	if env["KUBERNETES_SERVICE_HOST"] != "127.0.0.1" || env["KUBERNETES_SERVICE_PORT"] != "6443" {
		t.Errorf("env %v, want the API server address", env)
	}
	d := find(t, objs, "Deployment", "capstan")
	if n, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas"); n != 2 {
		t.Errorf("replicas %d, want 2", n)
	}
	if hn, _, _ := unstructured.NestedBool(d.Object, "spec", "template", "spec", "hostNetwork"); !hn {
		t.Error("hostNetwork not set")
	}
	if s, _, _ := unstructured.NestedMap(d.Object, "spec", "strategy"); len(s) != 1 || s["type"] != "Recreate" {
		t.Errorf("strategy %v, want Recreate alone: host ports cannot surge", s)
	}
	if a := str(t, d, "spec", "template", "metadata", "annotations", "team"); a != "infra" {
		t.Errorf("the user's patch was not applied: annotation team=%q", a)
	}
	cm := find(t, objs, "ConfigMap", "capstan-source")
	for k, want := range map[string]string{"CAPSTAN_SOURCE": "https://git.example/infra.git", "CAPSTAN_BRANCH": "prod", "CAPSTAN_PATH": "clusters", "CAPSTAN_SOURCE_USERNAME": "bot", "CAPSTAN_INTERVAL": "10s"} {
		if got := str(t, cm, "data", k); got != want {
			t.Errorf("ConfigMap %s=%q, want %q", k, got, want)
		}
	}
}

func TestObjectsRefusesBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts manifests.Options
		want string
	}{
		{"image with a space", manifests.Options{Image: "my image"}, `image "my image": want REPOSITORY[:TAG][@DIGEST]`},
		{"digest without algorithm", manifests.Options{Image: "reg/capstan@abc"}, `digest "abc": want algorithm:hex`},
		{"API server without port", manifests.Options{APIServer: "10.0.0.1"}, `API server address "10.0.0.1": want host:port`},
		{"interval not a duration", manifests.Options{Source: manifests.Source{Interval: "often"}}, `source interval "often": want a positive duration`},
		{"port out of range", manifests.Options{HealthPort: 70000}, "health port 70000: want 1-65535"},
		{"patch without a name", manifests.Options{Patches: []types.Patch{{Patch: "kind: Deployment\nspec: {replicas: 3}"}}}, "a strategic-merge patch names its object's kind and metadata.name"},
		{"patch of nothing", manifests.Options{Patches: []types.Patch{{Patch: "apiVersion: v1\nkind: Pod\nmetadata: {name: nope}"}}}, `patch 1: the install manifests have no Pod "nope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := manifests.Objects(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func toStrings(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}

func toMaps(v any) []map[string]any {
	var out []map[string]any
	for _, m := range v.([]any) {
		out = append(out, m.(map[string]any))
	}
	return out
}

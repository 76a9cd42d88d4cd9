package metal3

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// An object written in an older API version the providers still serve is
// converted by the provider's own conversion webhook: read in the version
// the controllers and the capm3 profile use, it carries the new shape.
var conversions = []struct {
	name string
	// old is the object as a user of the older version writes it.
	old string
	// resource and version to read it back in.
	resource schema.GroupVersionResource
	// path and want: a field of the converted object.
	path []string
	want any
}{
	{
		name: "a v1beta1 Cluster's infrastructureRef becomes a v1beta2 apiGroup reference",
		old: `
apiVersion: cluster.x-k8s.io/v1beta1
kind: Cluster
metadata: {name: east}
spec:
  infrastructureRef: {apiVersion: infrastructure.cluster.x-k8s.io/v1beta1, kind: Metal3Cluster, name: east}`,
		resource: schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta2", Resource: "clusters"},
		path:     []string{"spec", "infrastructureRef"},
		want:     map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Cluster", "name": "east"},
	},
	{
		name: "a v1beta1 Metal3Cluster's failure-domain map becomes the v1beta2 list",
		old: `
apiVersion: infrastructure.cluster.x-k8s.io/v1beta1
kind: Metal3Cluster
metadata: {name: east}
spec:
  controlPlaneEndpoint: {host: 192.0.2.100, port: 6443}
  failureDomains:
    rack-a: {controlPlane: true}`,
		resource: schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Resource: "metal3clusters"},
		path:     []string{"spec", "failureDomains"},
		want:     []any{map[string]any{"name": "rack-a", "controlPlane": true}},
	},
}

func TestConversionWebhooks(t *testing.T) {
	dyn := dynamic.NewForConfigOrDie(env.Config)
	for _, tc := range conversions {
		t.Run(tc.name, func(t *testing.T) {
			ns, err := env.CreateNamespace(t.Context(), "conversion")
			if err != nil {
				t.Fatal(err)
			}
			obj := parse(t, tc.old)
			gv, err := schema.ParseGroupVersion(obj.GetAPIVersion())
			if err != nil {
				t.Fatal(err)
			}
			oldRes := tc.resource.GroupResource().WithVersion(gv.Version)
			if _, err := dyn.Resource(oldRes).Namespace(ns).Create(t.Context(), obj, metav1.CreateOptions{}); err != nil {
				t.Fatalf("create %s %s: %v", obj.GetAPIVersion(), obj.GetKind(), err)
			}
			got, err := dyn.Resource(tc.resource).Namespace(ns).Get(t.Context(), obj.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatalf("read as %s: %v", tc.resource.Version, err)
			}
			field, _, err := unstructured.NestedFieldNoCopy(got.Object, tc.path...)
			if err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(field, tc.want) {
				t.Errorf("%s read as %s: %s = %v, want %v", obj.GetKind(), tc.resource.Version, strings.Join(tc.path, "."), field, tc.want)
			}
		})
	}
}

// An invalid object is refused by the provider's validating webhook, with
// the provider's own words, before anything is stored.
var refusals = []struct {
	name     string
	obj      string
	resource schema.GroupVersionResource
	// want are parts of the refusal, in the webhook's words.
	want []string
}{
	{
		name: "BareMetalHost with a BMC address scheme BMO does not know",
		obj: `
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata: {name: bad-bmc}
spec:
  online: true
  bootMACAddress: "00:00:5e:00:02:0a"
  bmc: {address: "foo://192.0.2.10", credentialsName: bad-bmc-secret}`,
		resource: schema.GroupVersionResource{Group: "metal3.io", Version: "v1alpha1", Resource: "baremetalhosts"},
		want:     []string{`admission webhook "baremetalhost.metal3.io" denied the request`, "foo"},
	},
	{
		name: "KubeadmControlPlane with a version that is not semantic",
		obj: `
apiVersion: controlplane.cluster.x-k8s.io/v1beta2
kind: KubeadmControlPlane
metadata: {name: bad-version}
spec:
  version: "one-point-thirty-five"
  replicas: 1
  machineTemplate:
    spec:
      infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: Metal3MachineTemplate, name: cp}
  kubeadmConfigSpec:
    clusterConfiguration: {certificatesDir: /etc/kubernetes/pki}`,
		resource: schema.GroupVersionResource{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta2", Resource: "kubeadmcontrolplanes"},
		want:     []string{"admission webhook", "kubeadmcontrolplane", "spec.version"},
	},
}

func TestValidatingWebhooks(t *testing.T) {
	dyn := dynamic.NewForConfigOrDie(env.Config)
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			ns, err := env.CreateNamespace(t.Context(), "refusal")
			if err != nil {
				t.Fatal(err)
			}
			obj := parse(t, tc.obj)
			_, err = dyn.Resource(tc.resource).Namespace(ns).Create(t.Context(), obj, metav1.CreateOptions{})
			if err == nil {
				t.Fatalf("%s %s was accepted", obj.GetKind(), obj.GetName())
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal %q does not say %q", err, w)
				}
			}
			if _, err := dyn.Resource(tc.resource).Namespace(ns).Get(t.Context(), obj.GetName(), metav1.GetOptions{}); err == nil {
				t.Errorf("%s %s was stored although refused", obj.GetKind(), obj.GetName())
			}
		})
	}
}

func parse(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
		t.Fatal(err)
	}
	return obj
}

package stages_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// servedByCluster is what a management cluster with Cluster API v1beta2
// and CAPM3 serves, the way discovery and the CRDs tell it.
var servedByCluster = stages.ServedAPIs{Kinds: map[schema.GroupKind][]stages.ServedVersion{
	{Kind: "ConfigMap"}:                 {{Version: "v1"}},
	{Kind: "Namespace"}:                 {{Version: "v1"}},
	{Group: "apps", Kind: "Deployment"}: {{Version: "v1"}},
	{Group: "cluster.x-k8s.io", Kind: "Cluster"}: {
		{Version: "v1beta2"}, {Version: "v1beta1", Deprecated: true, Warning: "cluster.x-k8s.io/v1beta1 Cluster is deprecated; use cluster.x-k8s.io/v1beta2 Cluster"},
	},
	{Group: "infrastructure.cluster.x-k8s.io", Kind: "Metal3Cluster"}:         {{Version: "v1beta2"}, {Version: "v1beta1"}},
	{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}:         {{Version: "v1"}},
	{Group: "infrastructure.cluster.x-k8s.io", Kind: "Metal3MachineTemplate"}: {{Version: "v1beta2", Deprecated: true}},
}}

const servedObjects = `apiVersion: v1
kind: ConfigMap
metadata: {name: network, namespace: edge}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: edge}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {name: edge, namespace: edge}
---
apiVersion: cluster.x-k8s.io/v1beta1
kind: Cluster
metadata: {name: old, namespace: edge}
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha5
kind: Metal3Cluster
metadata:
  name: edge
  namespace: edge
  annotations:
    config.kubernetes.io/origin: |
      path: base/metal3cluster.yaml
---
apiVersion: infrastructure.cluster.x-k8s.io/v1beta2
kind: Metal3Cluster
metadata: {name: edge-b, namespace: edge}
---
apiVersion: infrastructure.cluster.x-k8s.io/v1beta2
kind: Metal3MachineTemplate
metadata: {name: edge-cp, namespace: edge}
---
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata: {name: node-0, namespace: edge}
---
apiVersion: v1
kind: ConfigMapp
metadata: {name: typo, namespace: edge}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.example.com}
spec:
  group: example.com
  names: {kind: Gadget, plural: gadgets}
  scope: Namespaced
  versions:
    - {name: v1, served: true, storage: true}
    - {name: v1beta1, served: true, deprecated: true}
    - {name: v1alpha1, served: false}
---
apiVersion: example.com/v1
kind: Gadget
metadata: {name: g-v1, namespace: edge}
---
apiVersion: example.com/v1beta1
kind: Gadget
metadata: {name: g-v1beta1, namespace: edge}
---
apiVersion: example.com/v1alpha1
kind: Gadget
metadata: {name: g-v1alpha1, namespace: edge}
---
apiVersion: example.com/v1
kind: Sprocket
metadata: {name: s, namespace: edge}`

// servedObject picks one object of servedObjects by kind and name.
func servedObject(t *testing.T, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, obj := range decodeObjects(t, servedObjects) {
		if obj.GetKind() == kind && obj.GetName() == name {
			return obj
		}
	}
	t.Fatalf("no %s %s in servedObjects", kind, name)
	return nil
}

func TestCheckServed(t *testing.T) {
	crd := func(t *testing.T) *unstructured.Unstructured {
		return servedObject(t, "CustomResourceDefinition", "gadgets.example.com")
	}
	for _, tc := range []struct {
		name    string
		objects func(t *testing.T) []*unstructured.Unstructured
		want    []preflight.Problem
	}{
		{
			name: "core and built-in kinds in their served version are fine",
			objects: func(t *testing.T) []*unstructured.Unstructured {
				return []*unstructured.Unstructured{servedObject(t, "ConfigMap", "network"), servedObject(t, "Deployment", "web")}
			},
		},
		{
			name: "a CRD kind in its preferred version is fine",
			objects: func(t *testing.T) []*unstructured.Unstructured {
				return []*unstructured.Unstructured{servedObject(t, "Cluster", "edge"), servedObject(t, "Metal3Cluster", "edge-b")}
			},
		},
		{
			name: "a version the CRD does not serve names the served ones and the file",
			objects: func(t *testing.T) []*unstructured.Unstructured {
				return []*unstructured.Unstructured{servedObject(t, "Metal3Cluster", "edge")}
			},
			want: []preflight.Problem{{Object: "Metal3Cluster edge/edge", Field: "apiVersion",
				Message: "Metal3Cluster is served as infrastructure.cluster.x-k8s.io/v1beta2, v1beta1; not v1alpha5; write the object in infrastructure.cluster.x-k8s.io/v1beta2 (in base/metal3cluster.yaml)"}},
		},
		{
			name: "a kind no CRD defines says to install the provider",
			objects: func(t *testing.T) []*unstructured.Unstructured {
				return []*unstructured.Unstructured{servedObject(t, "BareMetalHost", "node-0")}
			},
			want: []preflight.Problem{{Object: "BareMetalHost edge/node-0", Field: "kind",
				Message: "the cluster serves no BareMetalHost in group metal3.io: no CustomResourceDefinition in the cluster or earlier in this plan defines it; install the provider first"}},
		},
		{
			name: "a kind unknown to a built-in group is a misspelling",
			objects: func(t *testing.T) []*unstructured.Unstructured {
				return []*unstructured.Unstructured{servedObject(t, "ConfigMapp", "typo")}
			},
			want: []preflight.Problem{{Object: "ConfigMapp edge/typo", Field: "kind",
				Message: "the cluster serves no ConfigMapp in the core API group; check the kind's spelling and apiVersion"}},
		},
		{
			name: "a deprecated version is a warning that names the version to use",
			objects: func(t *testing.T) []*unstructured.Unstructured {
				return []*unstructured.Unstructured{servedObject(t, "Cluster", "old")}
			},
			want: []preflight.Problem{{Object: "Cluster edge/old", Field: "apiVersion", Warning: true,
				Message: "cluster.x-k8s.io/v1beta1 is deprecated (cluster.x-k8s.io/v1beta1 Cluster is deprecated; use cluster.x-k8s.io/v1beta2 Cluster); write the object in cluster.x-k8s.io/v1beta2"}},
		},
		{
			name: "a deprecated version with nothing better served says so",
			objects: func(t *testing.T) []*unstructured.Unstructured {
				return []*unstructured.Unstructured{servedObject(t, "Metal3MachineTemplate", "edge-cp")}
			},
			want: []preflight.Problem{{Object: "Metal3MachineTemplate edge/edge-cp", Field: "apiVersion", Warning: true,
				Message: "infrastructure.cluster.x-k8s.io/v1beta2 is deprecated; no version of Metal3MachineTemplate that is not deprecated is served"}},
		},
		{
			name: "a CRD earlier in the plan makes its kind served, in its versions",
			objects: func(t *testing.T) []*unstructured.Unstructured {
				return []*unstructured.Unstructured{crd(t), servedObject(t, "Gadget", "g-v1"), servedObject(t, "Gadget", "g-v1beta1"), servedObject(t, "Gadget", "g-v1alpha1")}
			},
			want: []preflight.Problem{
				{Object: "Gadget edge/g-v1beta1", Field: "apiVersion", Warning: true,
					Message: "example.com/v1beta1 is deprecated; write the object in example.com/v1"},
				{Object: "Gadget edge/g-v1alpha1", Field: "apiVersion",
					Message: "Gadget is served as example.com/v1, v1beta1; not v1alpha1 (as the CustomResourceDefinition gadgets.example.com of this plan defines it); write the object in example.com/v1"},
			},
		},
		{
			name: "a CRD later in the plan comes too late",
			objects: func(t *testing.T) []*unstructured.Unstructured {
				return []*unstructured.Unstructured{servedObject(t, "Gadget", "g-v1"), crd(t)}
			},
			want: []preflight.Problem{{Object: "Gadget edge/g-v1", Field: "kind",
				Message: "the cluster serves no Gadget in group example.com: no CustomResourceDefinition in the cluster or earlier in this plan defines it; install the provider first"}},
		},
		{
			name: "a CRD of the plan defines its kind only: another kind of its group is still missing",
			objects: func(t *testing.T) []*unstructured.Unstructured {
				return []*unstructured.Unstructured{crd(t), servedObject(t, "Sprocket", "s")}
			},
			want: []preflight.Problem{{Object: "Sprocket edge/s", Field: "kind",
				Message: "the cluster serves no Sprocket in group example.com: no CustomResourceDefinition in the cluster or earlier in this plan defines it; install the provider first"}},
		},
		{
			name: "every problem is reported at once, in object order",
			objects: func(t *testing.T) []*unstructured.Unstructured {
				return decodeObjects(t, servedObjects)
			},
			want: []preflight.Problem{
				{Object: "Cluster edge/old", Field: "apiVersion", Warning: true},
				{Object: "Metal3Cluster edge/edge", Field: "apiVersion"},
				{Object: "Metal3MachineTemplate edge/edge-cp", Field: "apiVersion", Warning: true},
				{Object: "BareMetalHost edge/node-0", Field: "kind"},
				{Object: "ConfigMapp edge/typo", Field: "kind"},
				{Object: "Gadget edge/g-v1beta1", Field: "apiVersion", Warning: true},
				{Object: "Gadget edge/g-v1alpha1", Field: "apiVersion"},
				{Object: "Sprocket edge/s", Field: "kind"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := stages.CheckServed(tc.objects(t), servedByCluster)
			if len(got) != len(tc.want) {
				t.Fatalf("%d problems, want %d:\n%s", len(got), len(tc.want), lines(got))
			}
			for i, want := range tc.want {
				g := got[i]
				if g.Object != want.Object || g.Field != want.Field || g.Warning != want.Warning || (want.Message != "" && g.Message != want.Message) {
					t.Errorf("problem %d =\n  %+v\nwant\n  %+v", i, g, want)
				}
			}
		})
	}
}

func lines(problems []preflight.Problem) string {
	var b strings.Builder
	for _, p := range problems {
		b.WriteString(p.Line() + "\n")
	}
	return b.String()
}

// BuildPlan gives a validate stage every object the plan applies, in the
// order it applies them, while its network checks keep to its select.
func TestValidateStageLooksUpTheWholePlan(t *testing.T) {
	objects := decodeObjects(t, `apiVersion: example.com/v1
kind: Gadget
metadata: {name: g, namespace: edge}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: network, namespace: edge}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.example.com}
---
apiVersion: v1
kind: Secret
metadata: {name: removed, namespace: edge}`)
	plan, err := stages.BuildPlan([]capstanv1.StageSpec{
		{Name: "Preflight", Action: capstanv1.StageActionValidate, Select: capstanv1.Selector{Kinds: []string{"ConfigMap"}}},
		{Name: "Config", Select: capstanv1.Selector{Kinds: []string{"ConfigMap"}}},
		{Name: "Gadgets", Select: capstanv1.Selector{Kinds: []string{"Gadget", "CustomResourceDefinition"}}},
		{Name: "Cleanup", Action: capstanv1.StageActionDelete, Select: capstanv1.Selector{Kinds: []string{"Secret"}}},
	}, objects)
	if err != nil {
		t.Fatal(err)
	}
	preflight := plan.Stages[0]
	if got := strings.Join(refs(preflight.Objects), ","); got != "ConfigMap/edge/network" {
		t.Errorf("Preflight's network checks read %s, want the ConfigMap its select matches", got)
	}
	want := "ConfigMap/edge/network,CustomResourceDefinition/gadgets.example.com,Gadget/edge/g"
	if got := strings.Join(refs(preflight.PlanObjects), ","); got != want {
		t.Errorf("Preflight looks up %s, want every applied object in apply order: %s", got, want)
	}
	if got := plan.Stages[1].PlanObjects; got != nil {
		t.Errorf("an apply stage got PlanObjects %v", refs(got))
	}
}

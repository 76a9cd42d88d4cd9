package sim

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
)

// host is a BareMetalHost in the given state for the selection table.
func testHost(name, state string, edit ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	h := newObject(kindBareMetalHost, "ns", name)
	h.SetLabels(map[string]string{"cluster.x-k8s.io/role": "control-plane", "rack": "r1"})
	h.Object["status"] = map[string]any{"operationalStatus": "OK", "provisioning": map[string]any{"state": state}}
	for _, e := range edit {
		e(h)
	}
	return h
}

func testMetal3Machine(hostSelector map[string]any) *unstructured.Unstructured {
	m := newObject(kindMetal3Machine, "ns", "m3m")
	if hostSelector != nil {
		m.Object["spec"] = map[string]any{"hostSelector": hostSelector}
	}
	return m
}

// TestHostSelection pins which BareMetalHost CAPM3 gives a Metal3Machine.
func TestHostSelection(t *testing.T) {
	claimed := func(h *unstructured.Unstructured) {
		set(h.Object, map[string]any{"kind": "Metal3Machine", "name": "other"}, "spec", "consumerRef")
	}
	cases := []struct {
		name     string
		hosts    []*unstructured.Unstructured
		selector map[string]any
		want     string // "" for none
		wantErr  string
	}{
		{name: "an available host is chosen", hosts: []*unstructured.Unstructured{testHost("a", "available")}, want: "a"},
		{name: "a host still being inspected is not", hosts: []*unstructured.Unstructured{testHost("a", "inspecting")}},
		{name: "a provisioned host is not", hosts: []*unstructured.Unstructured{testHost("a", "provisioned")}},
		{name: "a host another machine claimed is not", hosts: []*unstructured.Unstructured{testHost("a", "available", claimed)}},
		{name: "a host in error is not", hosts: []*unstructured.Unstructured{testHost("a", "available", func(h *unstructured.Unstructured) {
			set(h.Object, "error", "status", "operationalStatus")
		})}},
		{name: "a paused host is not", hosts: []*unstructured.Unstructured{testHost("a", "available", func(h *unstructured.Unstructured) {
			h.SetAnnotations(map[string]string{hostPausedAnnotation: ""})
		})}},
		{name: "a host of another namespace is not", hosts: []*unstructured.Unstructured{testHost("a", "available", func(h *unstructured.Unstructured) {
			h.SetNamespace("other")
		})}},
		{name: "of two free hosts the first by name", hosts: []*unstructured.Unstructured{testHost("b", "available"), testHost("a", "available")}, want: "a"},
		{name: "matchLabels must all match", hosts: []*unstructured.Unstructured{testHost("a", "available")},
			selector: map[string]any{"matchLabels": map[string]any{"cluster.x-k8s.io/role": "worker"}}},
		{name: "matchLabels that match choose the host", hosts: []*unstructured.Unstructured{testHost("a", "available")},
			selector: map[string]any{"matchLabels": map[string]any{"cluster.x-k8s.io/role": "control-plane"}}, want: "a"},
		{name: "matchExpressions use CAPM3's lower-case operators", hosts: []*unstructured.Unstructured{testHost("a", "available")},
			selector: map[string]any{"matchExpressions": []any{
				map[string]any{"key": "rack", "operator": "in", "values": []any{"r1", "r2"}},
				map[string]any{"key": "cluster.x-k8s.io/role", "operator": "notin", "values": []any{"worker"}},
			}}, want: "a"},
		{name: "a matchExpression that fails rules the host out", hosts: []*unstructured.Unstructured{testHost("a", "available")},
			selector: map[string]any{"matchExpressions": []any{map[string]any{"key": "rack", "operator": "notin", "values": []any{"r1"}}}}},
		{name: "an unknown operator is an error", hosts: []*unstructured.Unstructured{testHost("a", "available")},
			selector: map[string]any{"matchExpressions": []any{map[string]any{"key": "rack", "operator": "near", "values": []any{"r1"}}}},
			wantErr:  "spec.hostSelector"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := chooseHost(tc.hosts, testMetal3Machine(tc.selector))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one about %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			name := ""
			if got != nil {
				name = got.GetName()
			}
			if name != tc.want {
				t.Errorf("chose %q, want %q", name, tc.want)
			}
		})
	}
}

// TestMetal3ProviderID pins both providerID forms CAPM3 v1.13 knows.
func TestMetal3ProviderID(t *testing.T) {
	h := newObject(kindBareMetalHost, "ns", "node-0")
	h.SetUID(types.UID("8a5e3f0c-1b2d-4c6e-9f00-0123456789ab"))
	m := newObject(kindMetal3Machine, "ns", "demo-x7k2p")
	for format, want := range map[ProviderIDFormat]string{
		"":                   "metal3://8a5e3f0c-1b2d-4c6e-9f00-0123456789ab",
		ProviderIDHostUID:    "metal3://8a5e3f0c-1b2d-4c6e-9f00-0123456789ab",
		ProviderIDNamespaced: "metal3://ns/node-0/demo-x7k2p",
	} {
		if got := format.ProviderID(h, m); got != want {
			t.Errorf("%q: providerID %q, want %q", format, got, want)
		}
	}
}

// TestHostConditions pins the conditions of each provisioning state to
// those the BareMetal Operator v0.13 computes; the capm3 profile reads
// Manageable.
func TestHostConditions(t *testing.T) {
	cases := []struct {
		state, operational                        string
		manageable, availableForProv, provisioned string
	}{
		{"registering", "OK", "False", "False", "False"},
		{"registering", "error", "False", "False", "False"},
		{"inspecting", "OK", "True", "False", "False"},
		{"preparing", "OK", "True", "False", "False"},
		{"available", "OK", "True", "True", "False"},
		{"provisioning", "OK", "True", "False", "False"},
		{"provisioning", "error", "True", "False", "False"},
		{"provisioned", "OK", "True", "False", "True"},
		{"deprovisioning", "OK", "True", "False", "False"},
	}
	for _, tc := range cases {
		h := testHost("a", tc.state, func(h *unstructured.Unstructured) { set(h.Object, tc.operational, "status", "operationalStatus") })
		h.SetGeneration(4)
		setConditions(h, time.Now(), hostConditions(h)...)
		for typ, want := range map[string]string{"Manageable": tc.manageable, "AvailableForProvisioning": tc.availableForProv, "Provisioned": tc.provisioned} {
			if got := conditionStatus(h, typ); got != want {
				t.Errorf("%s/%s: %s = %q, want %q", tc.state, tc.operational, typ, got, want)
			}
		}
		if tc.operational == "error" && conditionTrue(h, "Ready") {
			t.Errorf("%s/%s: Ready is True", tc.state, tc.operational)
		}
		conds, _, _ := unstructured.NestedSlice(h.Object, "status", "conditions")
		for _, c := range conds {
			if g, _ := integer(c.(map[string]any), "observedGeneration"); g != 4 {
				t.Errorf("%s: condition %v not at generation 4", tc.state, c)
			}
		}
	}
}

// TestSimConditionTransitions: a condition keeps its lastTransitionTime
// while its status holds, and gets a new one when it flips.
func TestSimConditionTransitions(t *testing.T) {
	obj := newObject(kindCluster, "ns", "c")
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	setConditions(obj, t0, condition{typ: "Available", status: "False", reason: "NotAvailable"})
	setConditions(obj, t0.Add(time.Minute), condition{typ: "Available", status: "False", reason: "NotAvailable", message: "still"})
	if got := lastTransition(obj, "Available"); got != "2026-01-02T03:04:05Z" {
		t.Errorf("unchanged status moved lastTransitionTime to %s", got)
	}
	setConditions(obj, t0.Add(2*time.Minute), condition{typ: "Available", status: "True", reason: "Available"})
	if got := lastTransition(obj, "Available"); got != "2026-01-02T03:06:05Z" {
		t.Errorf("flipped status has lastTransitionTime %s", got)
	}
}

func lastTransition(obj *unstructured.Unstructured, typ string) string {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		if m := c.(map[string]any); m["type"] == typ {
			return str(m, "lastTransitionTime")
		}
	}
	return ""
}

// TestSimOptions: New rejects what cannot be simulated, and says all of it.
func TestSimOptions(t *testing.T) {
	_, err := New(&rest.Config{Host: "https://127.0.0.1:1"}, Options{
		Delays:      Delays{HostInspection: -time.Second},
		Faults:      map[string]Fault{"node-0": "Flaky"},
		ProviderIDs: "uuid",
	})
	if err == nil {
		t.Fatal("New accepted a negative delay, an unknown fault and an unknown providerID format")
	}
	for _, want := range []string{"HostInspection", `"Flaky"`, `"uuid"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if _, err := New(&rest.Config{Host: "https://127.0.0.1:1"}, DefaultOptions()); err != nil {
		t.Errorf("default options: %v", err)
	}
	d := Delays{Default: time.Second, MachineBoot: time.Millisecond}.withDefaults()
	if d.HostProvisioning != time.Second || d.MachineBoot != time.Millisecond {
		t.Errorf("unset delays do not take Default, or set ones do not stay: %+v", d)
	}
}

// TestCAPIChildNames: names of created objects are valid, stable for an
// owner and ordinal, and differ between ordinals; a new machine template
// gets a new hash.
func TestCAPIChildNames(t *testing.T) {
	owner := newObject(kindKubeadmControlPlane, "ns", strings.Repeat("long-name-", 7))
	owner.SetUID("uid-1")
	a, b := childName(owner, 0), childName(owner, 1)
	if a != childName(owner, 0) || a == b {
		t.Errorf("child names %q, %q", a, b)
	}
	for _, n := range []string{a, b} {
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			t.Errorf("%q: %v", n, errs)
		}
	}
	md := newObject(kindMachineDeployment, "ns", "workers")
	set(md.Object, "v1.35.4", "spec", "template", "spec", "version")
	h1 := templateHash(md)
	if h1 != templateHash(md.DeepCopy()) {
		t.Error("template hash is not stable")
	}
	set(md.Object, "v1.35.5", "spec", "template", "spec", "version")
	if templateHash(md) == h1 {
		t.Error("a new version keeps the template hash")
	}
	if errs := validation.IsValidLabelValue(h1); len(errs) > 0 {
		t.Errorf("hash %q: %v", h1, errs)
	}
}

// TestCAPIMachineVersions: status.versions counts machines by the
// kubelet's version where known, else spec.version, oldest machine first.
func TestCAPIMachineVersions(t *testing.T) {
	machine := func(name string, age int, spec, kubelet string) *unstructured.Unstructured {
		m := newObject(kindMachine, "ns", name)
		m.SetCreationTimestamp(metav1.NewTime(time.Date(2026, 1, 1, 0, age, 0, 0, time.UTC)))
		set(m.Object, spec, "spec", "version")
		if kubelet != "" {
			set(m.Object, kubelet, "status", "nodeInfo", "kubeletVersion")
		}
		return m
	}
	got := machineVersions([]*unstructured.Unstructured{
		machine("new", 3, "v1.35.5", ""),
		machine("old-a", 1, "v1.35.5", "v1.35.4"),
		machine("old-b", 2, "v1.35.4", "v1.35.4"),
	})
	want := `[map[replicas:2 version:v1.35.4] map[replicas:1 version:v1.35.5]]`
	if s := fmt.Sprint(got); s != want {
		t.Errorf("versions %s, want %s", s, want)
	}
}

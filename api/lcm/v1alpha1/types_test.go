package v1alpha1_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
)

func machine() *lcmv1.LCMMachine {
	return &lcmv1.LCMMachine{
		TypeMeta:   metav1.TypeMeta{APIVersion: lcmv1.GroupVersion.String(), Kind: lcmv1.LCMMachineKind},
		ObjectMeta: metav1.ObjectMeta{Name: "worker-0", Namespace: "mgmt"},
		Spec: lcmv1.LCMMachineSpec{
			Type:        lcmv1.MachineTypeWorker,
			ClusterName: "mgmt",
			StateItems: []lcmv1.StateItem{
				{Name: "download", Phase: lcmv1.StatePhasePrepare, Runner: "downloader", Version: "1.2.0", Params: map[string]string{"url": "https://example/a.tgz"}},
				{Name: "join", Phase: lcmv1.StatePhaseDeploy, Runner: "ansible", Version: "1.2.0"},
			},
		},
		Status: lcmv1.LCMMachineStatus{
			ObservedGeneration: 1,
			State:              lcmv1.MachineStateDeploy,
			Hostname:           "worker-0",
			IP:                 "192.0.2.10",
			StateItemResults: []lcmv1.StateItemResult{
				{Name: "download", Phase: lcmv1.StatePhasePrepare, Version: "1.2.0", State: lcmv1.StateItemSucceeded, Attempts: 1, ExitCode: ptr.To[int32](0)},
				{Name: "join", Phase: lcmv1.StatePhaseDeploy, Version: "1.2.0", State: lcmv1.StateItemRunning, Attempts: 1},
			},
		},
	}
}

// TestJSONFieldNames pins the wire names the agent and the rollout use.
func TestJSONFieldNames(t *testing.T) {
	data, err := json.Marshal(machine())
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	spec := got["spec"].(map[string]any)
	status := got["status"].(map[string]any)
	for _, key := range []string{"type", "clusterName", "stateItems"} {
		if _, ok := spec[key]; !ok {
			t.Errorf("spec has no %q: %v", key, spec)
		}
	}
	for _, key := range []string{"observedGeneration", "state", "hostname", "ip", "stateItemResults"} {
		if _, ok := status[key]; !ok {
			t.Errorf("status has no %q: %v", key, status)
		}
	}
	item := spec["stateItems"].([]any)[0].(map[string]any)
	if item["phase"] != "prepare" || item["runner"] != "downloader" {
		t.Errorf("stateItems[0] = %v, want phase prepare, runner downloader", item)
	}

	var back lcmv1.LCMMachine
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, machine()) {
		t.Errorf("JSON round trip changed the machine:\n got %+v\nwant %+v", back, machine())
	}
}

func TestDeepCopyIsIndependent(t *testing.T) {
	orig := machine()
	cp := orig.DeepCopy()
	cp.Spec.StateItems[0].Params["url"] = "changed"
	*cp.Status.StateItemResults[0].ExitCode = 2
	if orig.Spec.StateItems[0].Params["url"] != "https://example/a.tgz" || *orig.Status.StateItemResults[0].ExitCode != 0 {
		t.Error("DeepCopy shares maps or pointers with the original")
	}

	cluster := &lcmv1.LCMCluster{Spec: lcmv1.LCMClusterSpec{
		Release:      "capstan-2.1.0",
		MachineTypes: lcmv1.MachineTypes{Manager: []lcmv1.StateItem{{Name: "join", Phase: lcmv1.StatePhaseDeploy}}},
	}}
	ccp := cluster.DeepCopy()
	ccp.Spec.MachineTypes.Manager[0].Name = "changed"
	if cluster.Spec.MachineTypes.Manager[0].Name != "join" {
		t.Error("LCMCluster DeepCopy shares its StateItems")
	}
}

func TestAddToScheme(t *testing.T) {
	s := runtime.NewScheme()
	if err := lcmv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{lcmv1.LCMClusterKind, "LCMClusterList", lcmv1.LCMMachineKind, "LCMMachineList"} {
		if !s.Recognizes(lcmv1.GroupVersion.WithKind(kind)) {
			t.Errorf("scheme does not know %s", kind)
		}
	}
}

// PendingItems is the agent's to-do list: items without a Succeeded result
// at their own version, in spec order.
func TestPendingItems(t *testing.T) {
	m := &lcmv1.LCMMachine{
		Spec: lcmv1.LCMMachineSpec{StateItems: []lcmv1.StateItem{
			{Name: "download", Phase: lcmv1.StatePhasePrepare, Version: "2"},
			{Name: "join", Phase: lcmv1.StatePhaseDeploy, Version: "2"},
			{Name: "reconfigure", Phase: lcmv1.StatePhaseReconfigure, Version: "2"},
		}},
		Status: lcmv1.LCMMachineStatus{StateItemResults: []lcmv1.StateItemResult{
			{Name: "download", Version: "2", State: lcmv1.StateItemSucceeded},
			{Name: "join", Version: "1", State: lcmv1.StateItemSucceeded},
			{Name: "reconfigure", Version: "2", State: lcmv1.StateItemFailed},
		}},
	}
	var names []string
	for _, item := range m.PendingItems() {
		names = append(names, item.Name)
	}
	if got := strings.Join(names, ","); got != "join,reconfigure" {
		t.Errorf("PendingItems = %s, want join (older version), reconfigure (failed)", got)
	}
	if r, ok := m.Result("join"); !ok || r.Version != "1" {
		t.Errorf("Result(join) = %+v, %v", r, ok)
	}
	if _, ok := m.Result("absent"); ok {
		t.Error("Result(absent) found a result")
	}
}

func TestDeployedBefore(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status lcmv1.LCMMachineStatus
		want   bool
	}{
		{"new machine", lcmv1.LCMMachineStatus{State: lcmv1.MachineStatePending}, false},
		{"prepared only", lcmv1.LCMMachineStatus{State: lcmv1.MachineStatePending, StateItemResults: []lcmv1.StateItemResult{
			{Name: "download", Phase: lcmv1.StatePhasePrepare, State: lcmv1.StateItemSucceeded}}}, false},
		{"first deploy running", lcmv1.LCMMachineStatus{State: lcmv1.MachineStateDeploy}, false},
		{"ready", lcmv1.LCMMachineStatus{State: lcmv1.MachineStateReady}, true},
		{"upgrading", lcmv1.LCMMachineStatus{State: lcmv1.MachineStateUpgrade}, true},
		{"deploy item succeeded, new items pending", lcmv1.LCMMachineStatus{State: lcmv1.MachineStateDeploy, StateItemResults: []lcmv1.StateItemResult{
			{Name: "join", Phase: lcmv1.StatePhaseDeploy, State: lcmv1.StateItemSucceeded}}}, true},
	} {
		m := &lcmv1.LCMMachine{Status: tc.status}
		if got := m.DeployedBefore(); got != tc.want {
			t.Errorf("%s: DeployedBefore = %v, want %v", tc.name, got, tc.want)
		}
	}
}

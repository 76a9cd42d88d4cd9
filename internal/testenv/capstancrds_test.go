package testenv

import (
	"context"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
)

// capstanCRDs is where `make generate` writes Capstan's own CRDs.
const capstanCRDs = "../../manifests/crds"

var installCapstanCRDs = sync.OnceValue(func() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return InstallCRDs(ctx, env.Config, capstanCRDs)
})

func lcmClient(t *testing.T) client.Client {
	t.Helper()
	if err := installCapstanCRDs(); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := lcmv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLCMMachineRoundTrip writes an LCMCluster and an LCMMachine through
// the generated CRDs, then the status as the agent would, and reads back
// what was written: the schema keeps every field the Go types have.
func TestLCMMachineRoundTrip(t *testing.T) {
	c := lcmClient(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	items := []lcmv1.StateItem{
		{Name: "download", Phase: lcmv1.StatePhasePrepare, Runner: "downloader", Version: "2.1.0", Params: map[string]string{"archive": "k8s-1.35.tgz"}},
		{Name: "join", Phase: lcmv1.StatePhaseDeploy, Runner: "ansible", Version: "2.1.0"},
		{Name: "managers", Phase: lcmv1.StatePhaseReconfigure, Runner: "ansible", Version: "2.1.0"},
	}
	cluster := &lcmv1.LCMCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "mgmt", Namespace: ns},
		Spec: lcmv1.LCMClusterSpec{
			Release:           "capstan-2.1.0",
			KubernetesVersion: "v1.35.4",
			MachineTypes:      lcmv1.MachineTypes{Manager: items, Worker: items[:2]},
		},
	}
	if err := c.Create(ctx, cluster); err != nil {
		t.Fatalf("create LCMCluster: %v", err)
	}

	m := &lcmv1.LCMMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "manager-0", Namespace: ns},
		Spec:       lcmv1.LCMMachineSpec{Type: lcmv1.MachineTypeManager, ClusterName: "mgmt", StateItems: items},
	}
	if err := c.Create(ctx, m); err != nil {
		t.Fatalf("create LCMMachine: %v", err)
	}
	started := metav1.NewTime(time.Now().Truncate(time.Second))
	status := lcmv1.LCMMachineStatus{
		ObservedGeneration: m.Generation,
		State:              lcmv1.MachineStateDeploy,
		Hostname:           "manager-0",
		IP:                 "192.0.2.11",
		StateItemResults: []lcmv1.StateItemResult{
			{Name: "download", Phase: lcmv1.StatePhasePrepare, Version: "2.1.0", State: lcmv1.StateItemSucceeded, Attempts: 1, ExitCode: ptr.To[int32](0), StartedAt: &started, FinishedAt: &started},
			{Name: "join", Phase: lcmv1.StatePhaseDeploy, Version: "2.1.0", State: lcmv1.StateItemRunning, Attempts: 2, Message: "kubeadm join: waiting for the API server", StartedAt: &started},
		},
		Conditions: []metav1.Condition{{
			Type: "Ready", Status: metav1.ConditionFalse, Reason: "Deploying", Message: "join is running",
			LastTransitionTime: started, ObservedGeneration: m.Generation,
		}},
	}
	m.Status = status
	if err := c.Status().Update(ctx, m); err != nil {
		t.Fatalf("update LCMMachine status: %v", err)
	}

	got := &lcmv1.LCMMachine{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Type != lcmv1.MachineTypeManager || got.Spec.ClusterName != "mgmt" || len(got.Spec.StateItems) != 3 ||
		got.Spec.StateItems[0].Params["archive"] != "k8s-1.35.tgz" {
		t.Errorf("spec read back = %+v", got.Spec)
	}
	if got.Status.State != lcmv1.MachineStateDeploy || got.Status.Hostname != "manager-0" || got.Status.IP != "192.0.2.11" ||
		got.Status.ObservedGeneration != m.Generation || len(got.Status.Conditions) != 1 {
		t.Errorf("status read back = %+v", got.Status)
	}
	if len(got.Status.StateItemResults) != 2 {
		t.Fatalf("stateItemResults read back = %+v", got.Status.StateItemResults)
	}
	r := got.Status.StateItemResults[0]
	if r.State != lcmv1.StateItemSucceeded || r.ExitCode == nil || *r.ExitCode != 0 || r.FinishedAt == nil || !r.FinishedAt.Equal(&started) {
		t.Errorf("stateItemResults[0] read back = %+v", r)
	}
	if got.Status.StateItemResults[1].Attempts != 2 || got.Status.StateItemResults[1].Message == "" {
		t.Errorf("stateItemResults[1] read back = %+v", got.Status.StateItemResults[1])
	}

	// A spec update leaves the status alone (status subresource).
	got.Spec.StateItems = items[:2]
	if err := c.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	if got.Status.State != lcmv1.MachineStateDeploy || got.Generation == got.Status.ObservedGeneration {
		t.Errorf("after a spec update: state %q, generation %d, observed %d; want the status kept and the generation ahead",
			got.Status.State, got.Generation, got.Status.ObservedGeneration)
	}
}

// TestLCMSchemaRejects pins what the generated schema refuses.
func TestLCMSchemaRejects(t *testing.T) {
	c := lcmClient(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		obj  client.Object
	}{
		{"a machine type other than manager or worker", &lcmv1.LCMMachine{
			ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: ns},
			Spec:       lcmv1.LCMMachineSpec{Type: "etcd"},
		}},
		{"a StateItem phase that does not exist", &lcmv1.LCMMachine{
			ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: ns},
			Spec:       lcmv1.LCMMachineSpec{Type: lcmv1.MachineTypeWorker, StateItems: []lcmv1.StateItem{{Name: "x", Phase: "install"}}},
		}},
		{"two StateItems of one name", &lcmv1.LCMCluster{
			ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: ns},
			Spec: lcmv1.LCMClusterSpec{Release: "r", MachineTypes: lcmv1.MachineTypes{Worker: []lcmv1.StateItem{
				{Name: "x", Phase: lcmv1.StatePhasePrepare}, {Name: "x", Phase: lcmv1.StatePhaseDeploy},
			}}},
		}},
		{"an LCMCluster without a release", &lcmv1.LCMCluster{
			ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: ns},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.Create(ctx, tt.obj)
			if err == nil {
				t.Fatal("created")
			}
			if !apierrors.IsInvalid(err) {
				t.Errorf("error = %v, want Invalid", err)
			}
		})
	}

	// The agent's state is an enum too.
	m := &lcmv1.LCMMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "state", Namespace: ns},
		Spec:       lcmv1.LCMMachineSpec{Type: lcmv1.MachineTypeWorker},
	}
	if err := c.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	m.Status.State = "Running"
	if err := c.Status().Update(ctx, m); !apierrors.IsInvalid(err) {
		t.Errorf("status.state Running: error = %v, want Invalid", err)
	}
}

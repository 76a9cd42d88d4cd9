package report

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func at(s string) *metav1.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	mt := metav1.NewTime(t)
	return &mt
}

// walking is a deployment in the middle of its walk: one stage Ready, one
// waiting and stuck, one Pending, with a move recorded.
func walking() *capstanv1.ClusterDeployment {
	return &capstanv1.ClusterDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: "mgmt-east", Namespace: "capstan-system", Generation: 3},
		Status: capstanv1.ClusterDeploymentStatus{
			ObservedGeneration: 3,
			Revision:           "main@sha1:4f2c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c",
			CurrentStage:       "InfrastructureReady",
			Stages: []capstanv1.StageStatus{
				{Name: "HostsRegistered", State: capstanv1.StageReady, StartedAt: at("2025-05-01T10:00:00Z"),
					FinishedAt: at("2025-05-01T10:03:10Z"), Attempts: 2, Objects: 4},
				{Name: "InfrastructureReady", State: capstanv1.StageInProgress, StartedAt: at("2025-05-01T10:03:11+02:00"),
					Attempts: 7, Objects: 2, Stuck: true, Message: "Metal3Cluster/mgmt-east: waiting for status.ready: a message long enough " +
						"that a YAML writer folding at eighty columns would fold it, which must not happen"},
				{Name: "ClusterReady", State: capstanv1.StagePending},
			},
			Conditions: []metav1.Condition{
				{Type: capstanv1.ConditionStalled, Status: metav1.ConditionFalse, Reason: "Progressing", LastTransitionTime: *at("2025-05-01T10:00:00Z")},
				{Type: capstanv1.ConditionReady, Status: metav1.ConditionFalse, Reason: "Progressing",
					Message: "stage InfrastructureReady: waiting", LastTransitionTime: *at("2025-05-01T10:00:00Z")},
				{Type: capstanv1.ConditionReconciling, Status: metav1.ConditionTrue, Reason: "Progressing",
					Message: "stage InfrastructureReady", LastTransitionTime: *at("2025-05-01T10:00:00Z")},
			},
			Pivot: &capstanv1.PivotStatus{Stage: "PivotDone", Phase: capstanv1.PivotCopied, Target: "capstan-system/mgmt-east-kubeconfig",
				StartedAt: at("2025-05-01T10:01:00Z"), Objects: 12},
			Inventory: &capstanv1.Inventory{Stages: []capstanv1.InventoryStage{{Name: "HostsRegistered",
				Entries: []capstanv1.InventoryEntry{{ID: "capstan-system_host-0_metal3.io_BareMetalHost", Version: "v1alpha1"}}}}},
		},
	}
}

func TestStatusFileGolden(t *testing.T) {
	data, err := NewFile(walking()).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "walking.yaml")
	if *update {
		if err := os.WriteFile(golden, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != string(want) {
		t.Errorf("status file differs from %s (go test -update rewrites it):\n%s", golden, data)
	}
	var back File
	if err := yaml.Unmarshal(data, &back); err != nil {
		t.Fatalf("the status file does not parse back: %v", err)
	}
	if back.Stages[1].Message != walking().Status.Stages[1].Message {
		t.Errorf("message did not survive a round trip: %q", back.Stages[1].Message)
	}
}

func TestStatusFilePhase(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*capstanv1.ClusterDeployment)
		want   string
	}{
		{"a stage waits", func(*capstanv1.ClusterDeployment) {}, PhaseProgressing},
		{"a stage's last attempt failed", func(cd *capstanv1.ClusterDeployment) {
			cd.Status.Stages[1].State = capstanv1.StageFailed
		}, PhaseFailed},
		{"every stage ready", func(cd *capstanv1.ClusterDeployment) {
			cd.Status.Conditions[1].Status = metav1.ConditionTrue
		}, PhaseReady},
		{"stalled wins over a failed stage", func(cd *capstanv1.ClusterDeployment) {
			cd.Status.Stages[1].State = capstanv1.StageFailed
			cd.Status.Conditions[0].Status = metav1.ConditionTrue
		}, PhaseStalled},
		{"being deleted", func(cd *capstanv1.ClusterDeployment) {
			cd.DeletionTimestamp = at("2025-05-01T11:00:00Z")
		}, PhaseDeleting},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cd := walking()
			tt.mutate(cd)
			if got := NewFile(cd).Phase; got != tt.want {
				t.Errorf("phase = %s, want %s", got, tt.want)
			}
		})
	}
}

// An unchanged status renders to the same bytes, and the inventory (which
// changes as objects are applied) is not part of the file.
func TestStatusFileStable(t *testing.T) {
	a, err := NewFile(trim(walking())).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cd := walking()
	cd.Status.Inventory.Stages[0].Entries = append(cd.Status.Inventory.Stages[0].Entries, capstanv1.InventoryEntry{ID: "x", Version: "v1"})
	cd.ResourceVersion = "42"
	slicesReverse(cd.Status.Conditions)
	b, err := NewFile(trim(cd)).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Errorf("the same status rendered twice differs:\n%s\n---\n%s", a, b)
	}
	if strings.Contains(string(a), "BareMetalHost") {
		t.Errorf("the inventory leaked into the status file:\n%s", a)
	}
}

func slicesReverse[T any](s []T) {
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
}

func TestScrub(t *testing.T) {
	s := &scrubber{}
	s.add(map[string][]byte{
		"username": []byte("capstan-system"), // not secret
		"password": []byte("pw-Zq81-never-print-me"),
		"value":    []byte("apiVersion: v1\nusers:\n- name: admin\n  user:\n    token: eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.payload\n"),
	})
	s.done()
	tests := []struct{ in, want string }{
		{"fetch https://capstan:pw-Zq81-never-print-me@git.example/infra.git: refused", "fetch https://***@git.example/infra.git: refused"},
		{"the password is pw-Zq81-never-print-me, twice pw-Zq81-never-print-me", "the password is ***, twice ***"},
		{"token eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.payload was refused", "token *** was refused"},
		{"git said no", "git said no"},
	}
	for _, tt := range tests {
		if got := s.clean(tt.in); got != tt.want {
			t.Errorf("clean(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if got := s.clean("namespace capstan-system"); got != "namespace capstan-system" {
		t.Errorf("a user name was scrubbed: %q", got)
	}
	cd := walking()
	cd.Status.Stages[0].Name = "pw-Zq81-never-print-me" // a field clean does not see
	cd.Status.Stages[1].Message = "waiting for pw-Zq81-never-print-me"
	data, err := NewFile(cd).Scrub(s.clean).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	data = s.cleanFile(data)
	if strings.Contains(string(data), "pw-Zq81") {
		t.Errorf("a Secret value is left in the file:\n%s", data)
	}
	var back File
	if err := yaml.Unmarshal(data, &back); err != nil {
		t.Fatalf("the scrubbed file does not parse: %v\n%s", err, data)
	}
	if back.Stages[1].Message != "waiting for ***" {
		t.Errorf("scrubbed message = %q", back.Stages[1].Message)
	}
}

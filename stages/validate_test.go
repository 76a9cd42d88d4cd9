package stages_test

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// decodeObjects reads a YAML stream written in a test.
func decodeObjects(t testing.TB, stream string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(stream, "\n---\n") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, obj)
	}
	return objs
}

const networkObjects = `apiVersion: v1
kind: ConfigMap
metadata:
  name: network
  namespace: edge
  labels: {capstan.dev/config: network}
data:
  controlPlaneCIDRs: 192.168.10.0/24
  podCIDR: %POD%
  httpProxy: %PROXY%
  noProxy: 10.96.0.0/12,10.233.0.0/16,192.168.10.0/24
  sshAuthorizedKeys: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAOhB7/zzhC+HXDdGOdLwJln5NYwm6UNXx3chmQSVTG4 ops@example
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {name: edge, namespace: edge}
spec:
  clusterNetwork:
    pods: {cidrBlocks: [10.233.0.0/16]}
    services: {cidrBlocks: [10.96.0.0/12]}`

func networkStage(t testing.TB, pod, proxy, noProxy string) *stages.Stage {
	stream := strings.NewReplacer("%POD%", pod, "%PROXY%", proxy).Replace(networkObjects)
	if noProxy != "" {
		stream = strings.Replace(stream, "10.96.0.0/12,10.233.0.0/16,192.168.10.0/24", noProxy, 1)
	}
	return &stages.Stage{
		StageSpec: capstanv1.StageSpec{Name: "Preflight", Action: capstanv1.StageActionValidate},
		Objects:   decodeObjects(t, stream),
	}
}

// A validate stage reads only its objects: the executor is built without
// a client, which any request to a cluster would trip over.
func TestValidateStage(t *testing.T) {
	e := stages.NewExecutor(nil)
	for _, tc := range []struct {
		name      string
		stage     *stages.Stage
		state     capstanv1.StageState // after ApplyStage
		message   []string             // lines the message holds
		finalRun  capstanv1.StageState // after Run: apply, then wait
		stalledOn []string             // problems the error joins
	}{
		{
			name:     "good network settings pass without a message",
			stage:    networkStage(t, "10.233.0.0/16", "http://proxy.example:3128", ""),
			state:    capstanv1.StageInProgress,
			finalRun: capstanv1.StageReady,
		},
		{
			name:     "a stage without objects passes",
			stage:    &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Preflight", Action: capstanv1.StageActionValidate}},
			state:    capstanv1.StageInProgress,
			finalRun: capstanv1.StageReady,
		},
		{
			name:  "warnings pass and are listed in the message",
			stage: networkStage(t, "10.233.0.0/16", "http://proxy.example:3128", "localhost"),
			state: capstanv1.StageInProgress,
			message: []string{
				"preflight passed with 0 errors, 3 warnings:",
				"WARNING ConfigMap edge/network: data.noProxy: does not cover the service CIDR 10.96.0.0/12",
				"WARNING ConfigMap edge/network: data.noProxy: does not cover the pod CIDR 10.233.0.0/16",
				"WARNING ConfigMap edge/network: data.noProxy: does not cover the control-plane network 192.168.10.0/24",
			},
			finalRun: capstanv1.StageReady,
		},
		{
			name:  "errors stall the stage with the whole report, warnings included",
			stage: networkStage(t, "10.96.0.0/16", "ftp://proxy.example", "localhost"),
			state: capstanv1.StageFailed,
			message: []string{
				"preflight found 3 errors, 3 warnings:",
				"ERROR ConfigMap edge/network: data.podCIDR: 10.96.0.0/16 overlaps the service CIDR 10.96.0.0/12 (default, data.serviceCIDR unset)",
				"ERROR ConfigMap edge/network: data.httpProxy: ftp://proxy.example: the scheme must be http or https",
				"WARNING ConfigMap edge/network: data.noProxy: does not cover the service CIDR 10.96.0.0/12 (default)",
				"WARNING ConfigMap edge/network: data.noProxy: does not cover the pod CIDR 10.96.0.0/16",
				"WARNING ConfigMap edge/network: data.noProxy: does not cover the control-plane network 192.168.10.0/24",
				"ERROR Cluster edge/edge: spec.clusterNetwork.pods.cidrBlocks: [10.233.0.0/16] disagrees with the pod CIDR 10.96.0.0/16",
			},
			finalRun: capstanv1.StageFailed,
			stalledOn: []string{
				"ConfigMap edge/network: data.podCIDR: 10.96.0.0/16 overlaps",
				"ConfigMap edge/network: data.httpProxy: ftp://proxy.example",
				"Cluster edge/edge: spec.clusterNetwork.pods.cidrBlocks",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := e.ApplyStage(t.Context(), tc.stage, owner)
			if res.State != tc.state || res.Applied || res.ChangeSet != nil {
				t.Errorf("ApplyStage = %s (applied %v), want %s and nothing applied", res.State, res.Applied, tc.state)
			}
			if len(tc.message) == 0 && res.Message != "" {
				t.Errorf("message = %q, want none", res.Message)
			}
			for _, line := range tc.message {
				if !strings.Contains(res.Message, line) {
					t.Errorf("message does not hold %q:\n%s", line, res.Message)
				}
			}
			if lines := strings.Count(res.Message, "\n") + 1; len(tc.message) > 0 && lines != len(tc.message) {
				t.Errorf("message has %d lines, want a header and one line per problem, %d in all:\n%s", lines, len(tc.message), res.Message)
			}
			if len(tc.stalledOn) > 0 {
				if !stages.IsStalled(res.Err) {
					t.Errorf("err = %v, want it stalled", res.Err)
				}
				var p preflight.Problem
				if !errors.As(res.Err, &p) {
					t.Errorf("errors.As(err, *preflight.Problem) = false for %v", res.Err)
				}
				for _, want := range tc.stalledOn {
					if !strings.Contains(res.Err.Error(), want) {
						t.Errorf("err does not hold %q:\n%v", want, res.Err)
					}
				}
				if strings.Contains(res.Err.Error(), "WARNING") {
					t.Errorf("err holds warnings, which do not fail the stage:\n%v", res.Err)
				}
			} else if res.Err != nil {
				t.Errorf("err = %v, want none", res.Err)
			}

			run := e.Run(t.Context(), tc.stage, owner, stages.RunOptions{})
			if run.State != tc.finalRun {
				t.Errorf("Run = %s (%s), want %s", run.State, run.Message, tc.finalRun)
			}
		})
	}
}

// A validate stage checks the objects its selector matches, though an
// apply stage owns and applies them.
func TestValidateStageChecksTheObjectsItSelects(t *testing.T) {
	objects := networkStage(t, "10.96.0.0/16", "http://proxy.example:3128", "").Objects
	specs := []capstanv1.StageSpec{
		{Name: "Preflight", Action: capstanv1.StageActionValidate, Select: capstanv1.Selector{Kinds: []string{"ConfigMap", "cluster.x-k8s.io/Cluster"}}},
		{Name: "Apply", Select: capstanv1.Selector{Kinds: []string{"*"}}},
	}
	plan, err := stages.BuildPlan(specs, objects)
	if err != nil {
		t.Fatal(err)
	}
	if got := refs(plan.Stages[0].Objects); strings.Join(got, ",") != "ConfigMap/edge/network,Cluster/edge/edge" {
		t.Errorf("Preflight checks %v, want the ConfigMap and the Cluster", got)
	}
	if got := refs(plan.Stages[1].Objects); len(got) != 2 {
		t.Errorf("Apply applies %v, want both objects", got)
	}
	res := stages.NewExecutor(nil).ApplyStage(t.Context(), &plan.Stages[0], owner)
	if res.State != capstanv1.StageFailed || !strings.Contains(res.Message, "data.podCIDR: 10.96.0.0/16 overlaps the service CIDR") {
		t.Errorf("ApplyStage = %s (%s), want the overlap reported", res.State, res.Message)
	}
}

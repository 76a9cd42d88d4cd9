package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// Every ClusterDeployment of examples/ renders into its stages, and the
// upgrade overlay renders too. The Metal3 clusters put each kind in the
// capm3 stage that builds it.
func TestExamplesRender(t *testing.T) {
	files, err := filepath.Glob("../../examples/clusters/*/*clusterdeployment.yaml")
	if err != nil || len(files) < 5 {
		t.Fatalf("example ClusterDeployments = %v (%v), want bootstrap, demo, mgmt, mgmt-lcm and workload-east", files, err)
	}
	header := regexp.MustCompile(`(?m)^# stage (\S+) \((\w+), (\d+) objects?\)$`)
	for _, file := range files {
		t.Run(filepath.Base(filepath.Dir(file)), func(t *testing.T) {
			out, err := runCLI(t, "render", "--root", "../../examples", "-f", file)
			if err != nil {
				t.Fatalf("render %s: %v", file, err)
			}
			if len(header.FindAllString(out, -1)) == 0 {
				t.Errorf("render %s printed no stage:\n%s", file, out)
			}
			if strings.Contains(out, "${") {
				t.Errorf("render %s left a ${VAR} unsubstituted:\n%s", file, out)
			}
			if out, err := runCLI(t, "validate", "--root", "../../examples", "-f", file); err != nil {
				t.Errorf("validate %s: %v\n%s", file, err, out)
			}
		})
	}

	want := map[string]string{ // stage -> its objects' count in mgmt
		"Preflight":               "3",  // checks the network ConfigMap, the Cluster and the IPPool
		"HostsRegistered":         "12", // namespace, network ConfigMap, 5 hosts and 5 BMC Secrets
		"InfrastructureReady":     "3",
		"ControlPlaneInitialized": "5",
		"ControlPlaneReady":       "1",
		"WorkersReady":            "1",
		"ClusterReady":            "1",
	}
	// In this order: the upgrade changes want.
	for _, overlay := range [][2]string{{"mgmt", "clusters/mgmt/overlay"}, {"mgmt-upgrade", "clusters/mgmt/upgrade"}} {
		name, path := overlay[0], overlay[1]
		cd, err := os.ReadFile("../../examples/clusters/mgmt/clusterdeployment.yaml")
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "cd.yaml")
		if err := os.WriteFile(file, []byte(strings.Replace(string(cd), "clusters/mgmt/overlay", path, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := runCLI(t, "render", "--root", "../../examples", "-f", file)
		if err != nil {
			t.Fatalf("render %s: %v", name, err)
		}
		got := map[string]string{}
		for _, m := range header.FindAllStringSubmatch(out, -1) {
			got[m[1]] = m[3]
		}
		if name == "mgmt-upgrade" {
			want["ControlPlaneInitialized"] = "7" // and the two v1.36 machine templates
			if !strings.Contains(out, "version: v1.36.1") || strings.Contains(out, "version: v1.35.4") {
				t.Errorf("the upgrade overlay does not move every version to v1.36.1")
			}
		}
		for stage, n := range want {
			if got[stage] != n {
				t.Errorf("%s: stage %s has %s objects, want %s", name, stage, got[stage], n)
			}
		}
	}
}

// The bootstrap example puts every object in the bootstrap profile's
// stage for it, and labels an object with every component the profile
// selects: no stage of the sixteen is empty where seed 000 does something.
func TestBootstrapExample(t *testing.T) {
	out, err := runCLI(t, "render", "--root", "../../examples", "-o", "json", "-f", "../../examples/clusters/bootstrap/clusterdeployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var plan []struct {
		Name    string           `json:"name"`
		Action  string           `json:"action"`
		Objects []map[string]any `json:"objects"`
	}
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	labels := map[string]bool{}
	for _, s := range plan {
		got[s.Name] = len(s.Objects)
		for _, o := range s.Objects {
			u := unstructured.Unstructured{Object: o}
			if c := u.GetLabels()["capstan.dev/component"]; c != "" {
				labels[c] = true
			}
		}
	}
	want := map[string]int{
		"ProxySettingsHandled":               6,  // reads the network ConfigMap, the Cluster, the IPPool (and every ConfigMap)
		"ClusterSSHConfigured":               6,  // namespace central, 5 BMC Secrets
		"ProviderUpdatedInBootstrap":         8,  // namespace, settings, 6 controllers
		"ProviderEnabledInBootstrap":         6,  // the 6 controllers
		"NodesReady":                         21, // 5 hosts, network ConfigMap, 9 Cluster API and Metal3 objects, LCMCluster, 5 LCMMachines
		"ObjectsCreated":                     4,  // 3 namespaces, the IAM Secret
		"ProviderConfigured":                 1,
		"HelmBundleReady":                    7, // the new cluster's 6 controllers, the helm-controller
		"ControllersDisabledBeforePivot":     6,
		"PivotDone":                          1,
		"ControllersEnabledAfterPivot":       6,
		"MachinesLCMAgentUpdated":            6,
		"HelmControllerDisabledBeforeConfig": 1,
		"HelmControllerConfigUpdated":        1,
		"HelmControllerEnabledAfterConfig":   1,
		"ClusterReady":                       8, // the Cluster, the new cluster's 7 Deployments
	}
	for stage, n := range want {
		if got[stage] != n {
			t.Errorf("stage %s has %d objects, want %d", stage, got[stage], n)
		}
	}
	if len(plan) != 16 {
		t.Errorf("%d stages, want the bootstrap profile's 16", len(plan))
	}
	profile, err := stages.LoadProfile("bootstrap")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range profile.Stages {
		for _, c := range profileComponents(s.Select) {
			if !labels[c] {
				t.Errorf("stage %s selects capstan.dev/component %s, which no object of the example carries", s.Name, c)
			}
		}
	}
}

// profileComponents lists the capstan.dev/component values a selector
// asks for (matchLabels, In), not those it excludes.
func profileComponents(sel capstanv1.Selector) []string {
	if sel.LabelSelector == nil {
		return nil
	}
	var out []string
	if v, ok := sel.LabelSelector.MatchLabels["capstan.dev/component"]; ok {
		out = append(out, v)
	}
	for _, e := range sel.LabelSelector.MatchExpressions {
		if e.Key == "capstan.dev/component" && e.Operator == metav1.LabelSelectorOpIn {
			out = append(out, e.Values...)
		}
	}
	return out
}

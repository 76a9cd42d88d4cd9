package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every ClusterDeployment of examples/ renders into its stages, and the
// upgrade overlay renders too. The Metal3 clusters put each kind in the
// capm3 stage that builds it.
func TestExamplesRender(t *testing.T) {
	files, err := filepath.Glob("../../examples/clusters/*/*clusterdeployment.yaml")
	if err != nil || len(files) < 4 {
		t.Fatalf("example ClusterDeployments = %v (%v), want demo, mgmt, mgmt-lcm and workload-east", files, err)
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

package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/internal/gitserver"
)

// TestLocalEndpoints: with --providers real, every ClusterDeployment that
// substitutes API_ENDPOINT gets 127.0.0.1, a port of its own and the demo
// hardware's NIC; its comments and other files stay as they are.
func TestLocalEndpoints(t *testing.T) {
	files := []gitserver.File{
		{Path: "clusters/a/cd.yaml", Content: "# cluster a\nkind: ClusterDeployment\nspec:\n  substitute:\n    CLUSTER_NAME: a # the name\n    API_ENDPOINT: 192.0.2.100\n    API_PORT: \"6443\"\n"},
		{Path: "clusters/b/cd.yaml", Content: "kind: ClusterDeployment\nspec:\n  substitute:\n    API_ENDPOINT: 192.0.2.200\n"},
		{Path: "clusters/c/cd.yaml", Content: "kind: ClusterDeployment\nspec:\n  profile: default\n"},
		{Path: "bases/x/cluster.yaml", Content: "host: ${API_ENDPOINT}\n"},
	}
	got, moved, err := localEndpoints(files)
	if err != nil {
		t.Fatal(err)
	}
	if len(moved) != 2 {
		t.Errorf("moved %v, want the two deployments that substitute API_ENDPOINT", moved)
	}
	port := regexp.MustCompile(`API_PORT: "(\d+)"`)
	var ports []string
	for _, f := range got[:2] {
		for _, want := range []string{"API_ENDPOINT: 127.0.0.1\n", "BOOT_INTERFACE: nic-1\n"} {
			if !strings.Contains(f.Content, want) {
				t.Errorf("%s:\n%s\nwant %q", f.Path, f.Content, want)
			}
		}
		m := port.FindAllStringSubmatch(f.Content, -1)
		if len(m) != 1 {
			t.Fatalf("%s has %d API_PORT lines:\n%s", f.Path, len(m), f.Content)
		}
		ports = append(ports, m[0][1])
	}
	if ports[0] == ports[1] {
		t.Errorf("both deployments got port %s", ports[0])
	}
	if !strings.Contains(got[0].Content, "# cluster a\n") || !strings.Contains(got[0].Content, "CLUSTER_NAME: a # the name\n") {
		t.Errorf("comments lost:\n%s", got[0].Content)
	}
	for i := 2; i < 4; i++ {
		if got[i].Content != files[i].Content {
			t.Errorf("%s changed:\n%s", files[i].Path, got[i].Content)
		}
	}
}

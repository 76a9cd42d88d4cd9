package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

// runCLI runs capstan with args, as a user would, and returns its output.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (run go test -update after checking):\n%s", path, got)
	}
}

// The README's render command, run as written there.
func TestRenderExampleAsInREADME(t *testing.T) {
	out, err := runCLI(t, "render", "--root", "../../examples", "-f", "../../examples/clusters/demo/clusterdeployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "render-demo.yaml", out)
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "go run ./cmd/capstan render --root examples -f examples/clusters/demo/clusterdeployment.yaml") {
		t.Error("README no longer shows the render command this test runs; keep them in step")
	}
}

func TestRenderJSONGroupsByStage(t *testing.T) {
	out, err := runCLI(t, "render", "--root", "../../examples", "-o", "json", "-f", "../../examples/clusters/demo/clusterdeployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var stages []renderedStage
	if err := json.Unmarshal([]byte(out), &stages); err != nil {
		t.Fatalf("-o json is not JSON: %v\n%s", err, out)
	}
	var names []string
	for _, s := range stages {
		names = append(names, s.Name)
	}
	if got := strings.Join(names, ","); got != "Namespace,Network,Workloads" {
		t.Errorf("stages = %s, want Namespace,Network,Workloads", got)
	}
}

func TestRenderErrorsSayWhatToFix(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no path", []string{"render"}, "give PATH or -f"},
		{"missing overlay", []string{"render", "--root", "../../examples", "clusters/nope"}, "clusters/nope"},
		{"bad substitute flag", []string{"render", "--root", "../../examples", "--substitute", "X", "clusters/demo/overlay"}, `expected VAR=value`},
		{"bad output", []string{"render", "--root", "../../examples", "-o", "xml", "-f", "../../examples/clusters/demo/clusterdeployment.yaml"}, "expected yaml or json"},
		{"unknown profile", []string{"profiles", "show", "nope"}, "not built in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runCLI(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	out, err := runCLI(t, "version")
	if err != nil || !strings.HasPrefix(out, "capstan ") {
		t.Fatalf("version = %q, %v", out, err)
	}
}

func TestRenderMasksSecrets(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"app/kustomization.yaml": "resources: [secret.yaml]\n",
		"app/secret.yaml": "apiVersion: v1\nkind: Secret\nmetadata: {name: creds, namespace: ns}\n" +
			"data: {password: cGxhbnRlZA==}\nstringData: {token: planted-token}\n",
	}
	for name, content := range files {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	flags := []string{"render", "--root", root, "app", "--substitute", "X=y"}
	for _, format := range []string{"yaml", "json"} {
		out, err := runCLI(t, append(flags, "-o", format)...)
		if err != nil {
			t.Fatalf("-o %s: %v\n%s", format, err, out)
		}
		for _, planted := range []string{"cGxhbnRlZA==", "planted-token"} {
			if strings.Contains(out, planted) {
				t.Errorf("-o %s prints the Secret's value %q:\n%s", format, planted, out)
			}
		}
		if !strings.Contains(out, "password") || !strings.Contains(out, "masked") {
			t.Errorf("-o %s: the Secret's keys should stay, their values masked:\n%s", format, out)
		}
	}
	out, err := runCLI(t, append(flags, "--show-secrets")...)
	if err != nil || !strings.Contains(out, "planted-token") {
		t.Errorf("--show-secrets: %v; want the value printed:\n%s", err, out)
	}
}

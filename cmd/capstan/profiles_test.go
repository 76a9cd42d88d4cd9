package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/stages"
)

var updateProfiles = flag.Bool("update-profiles", false, "rewrite testdata/golden/profiles-list.txt")

// runCapstan runs the capstan command line in-process and returns what it
// printed on stdout.
func runCapstan(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(t.Context())
	return out.String(), err
}

// TestProfilesListGolden pins what `capstan profiles list` prints: one
// line per built-in profile with its stage count and description.
func TestProfilesListGolden(t *testing.T) {
	got, err := runCapstan(t, "profiles", "list")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join("testdata", "golden", "profiles-list.txt")
	if *updateProfiles {
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/capstan -update-profiles to create it)", err)
	}
	if got != string(want) {
		t.Errorf("capstan profiles list differs from %s (run go test ./cmd/capstan -update-profiles after checking):\n--- got\n%s--- want\n%s", file, got, want)
	}
}

// TestProfilesShow prints a profile exactly as embedded, so that a user can
// copy it, and names the built-in profiles when asked for another.
func TestProfilesShow(t *testing.T) {
	for _, name := range stages.Profiles() {
		got, err := runCapstan(t, "profiles", "show", name)
		if err != nil {
			t.Fatalf("profiles show %s: %v", name, err)
		}
		want, _ := stages.ProfileYAML(name)
		if got != string(want) {
			t.Errorf("profiles show %s is not the embedded YAML", name)
		}
	}
	_, err := runCapstan(t, "profiles", "show", "nonesuch")
	if err == nil || !strings.Contains(err.Error(), "capm3") {
		t.Errorf("profiles show nonesuch: error = %v, want one naming the built-in profiles", err)
	}
}

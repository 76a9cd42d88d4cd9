package preflight

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var updateGroups = flag.Bool("update", false, "rewrite testdata/group/*.golden")

// groupedReport is the revision: 21 objects in two files whose
// namespace nothing creates, a field misspelt in three machine templates, one object
// of an unserved kind and a deprecated version's warning on two objects.
func groupedReport() Report {
	var r Report
	const ns = "metadata.namespace"
	const msg = "namespace orion does not exist and no stage before HostsRegistered creates it: add a Namespace object or set `namespace:` in kustomization.yaml"
	for i := range 14 {
		r.Problems = append(r.Problems, Problem{Object: fmt.Sprintf("BareMetalHost orion/node-%d", i), Field: ns,
			Message: msg + " (in clusters/orion/base/hosts.yaml)"})
	}
	for i := range 7 {
		r.Problems = append(r.Problems, Problem{Object: fmt.Sprintf("IPPool orion/pool-%d", i), Field: ns,
			Message: msg + " (in clusters/orion/base/network.yaml)"})
	}
	for i := range 3 {
		r.Problems = append(r.Problems, Problem{Object: fmt.Sprintf("Metal3MachineTemplate orion/workers-%d", i), Field: "spec.template.spec.image.format",
			Message: "schema check: the schema of infrastructure.cluster.x-k8s.io/v1beta2 Metal3MachineTemplate declares no such field; check its spelling and the apiVersion (in clusters/orion/base/machines.yaml)"})
	}
	r.Problems = append(r.Problems, Problem{Object: "Sprocket orion/one", Field: "kind",
		Message: "the cluster serves no Sprocket in group missing.example: no CustomResourceDefinition in the cluster or earlier in this plan defines it; install the provider first (in clusters/orion/extra.yaml)"})
	for _, name := range []string{"a", "b"} {
		r.Problems = append(r.Problems, Problem{Object: "Widget orion/" + name, Field: "apiVersion", Warning: true,
			Message: "example.com/v1beta1 is deprecated; write the object in example.com/v1 (in clusters/orion/widgets.yaml)"})
	}
	return r
}

// One line per cause, the objects counted and the first few named, as
// many as fit the width; a cause of one object keeps the object's line.
func TestGroupedLinesGolden(t *testing.T) {
	r := groupedReport()
	for _, width := range []int{80, 200} {
		t.Run(fmt.Sprint(width), func(t *testing.T) {
			got := r.GroupedLines(width)
			file := filepath.Join("testdata", "group", fmt.Sprintf("lines-%d.golden", width))
			if *updateGroups {
				if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (run go test ./stages/preflight -run TestGroupedLinesGolden -update)", err)
			}
			if got != string(want) {
				t.Errorf("grouped lines at %d columns differ from %s:\n--- got\n%s--- want\n%s", width, file, got, want)
			}
			if n := strings.Count(got, "\n"); n != 4 {
				t.Errorf("%d lines, want 4 (one per cause):\n%s", n, got)
			}
		})
	}
}

// The grouping keeps every problem: the JSON report is per object.
func TestGroupsKeepEveryProblem(t *testing.T) {
	r := groupedReport()
	n := 0
	for _, g := range r.Groups() {
		n += len(g.Problems)
	}
	if n != len(r.Problems) {
		t.Errorf("groups hold %d problems, want %d", n, len(r.Problems))
	}
	first := r.Groups()[0]
	if len(first.Problems) != 21 || strings.Join(first.Files, ",") != "clusters/orion/base/hosts.yaml,clusters/orion/base/network.yaml" {
		t.Errorf("first group: %d problems in %v, want 21 in hosts.yaml and network.yaml", len(first.Problems), first.Files)
	}
}

// A message whose parenthesis is not a file stays whole.
func TestSplitFile(t *testing.T) {
	for _, tc := range []struct{ in, msg, file string }{
		{"bad (in a/b.yaml)", "bad", "a/b.yaml"},
		{"bad (in the cluster)", "bad (in the cluster)", ""},
		{"bad", "bad", ""},
		{"bad (in )", "bad (in )", ""},
	} {
		if msg, file := splitFile(tc.in); msg != tc.msg || file != tc.file {
			t.Errorf("splitFile(%q) = %q, %q; want %q, %q", tc.in, msg, file, tc.msg, tc.file)
		}
	}
}

package report

import (
	"fmt"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/stages"
)

// A plan comment says a cause once: five objects in a namespace that
// does not exist are one line that counts them and names the first
// three; a different cause keeps its own line.
func TestPlanProblemsGroupedByCause(t *testing.T) {
	var problems []stages.ObjectDiff
	for i := range 5 {
		problems = append(problems, stages.ObjectDiff{Ref: fmt.Sprintf("ConfigMap/orion/host-%d", i), Action: stages.DiffFailed,
			File: "clusters/orion/hosts.yaml", Error: `namespaces "orion" not found`})
	}
	problems = append(problems, stages.ObjectDiff{Ref: "Widget/orion/w", Action: stages.DiffInvalid, Field: "spec.size",
		File: "clusters/orion/widgets.yaml", Error: "must be an integer"})
	var b strings.Builder
	writeProblems(&b, problems)
	for _, want := range []string{
		`5 objects (ConfigMap/orion/host-0, ConfigMap/orion/host-1, ConfigMap/orion/host-2 and 2 more) in clusters/orion/hosts.yaml: failed: namespaces "orion" not found`,
		"clusters/orion/widgets.yaml: Widget/orion/w: spec.size: invalid: must be an integer",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("comment lacks %q:\n%s", want, b.String())
		}
	}
	if n := strings.Count(b.String(), "not found"); n != 1 {
		t.Errorf("the missing namespace is said %d times, want once:\n%s", n, b.String())
	}
}

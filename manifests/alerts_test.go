package manifests_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/capstan-dev/capstan/internal/promserver"
	"github.com/capstan-dev/capstan/internal/promserver/promtest"
)

const (
	rulesFile          = "alerts/capstan.rules.yaml"
	rulesTestFile      = "alerts/capstan.rules.test.yaml"
	prometheusRuleFile = "alerts/prometheusrule.yaml"
)

// shippedAlerts are the alerts the issue asks for; each has a runbook.
var shippedAlerts = []string{"CapstanStageStuck", "CapstanReconcileFailing", "CapstanSourceStale", "CapstanMetricsMissing"}

func promtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), promtest.Tools(t).Promtool, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
}

func TestAlertRulesPassPromtoolCheck(t *testing.T) {
	promtool(t, "alerts", "check", "rules", filepath.Base(rulesFile))
}

// capstan.rules.test.yaml feeds series that fire each alert and series that
// must not.
func TestAlertRulesPassPromtoolUnitTests(t *testing.T) {
	data, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, alert := range shippedAlerts {
		if !bytes.Contains(data, []byte("alertname: "+alert)) {
			t.Errorf("%s has no test of %s", rulesTestFile, alert)
		}
	}
	promtool(t, "alerts", "test", "rules", filepath.Base(rulesTestFile))
}

func readRules(t *testing.T) (*promserver.RuleFile, []byte) {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := promserver.ParseRules(data)
	if err != nil {
		t.Fatal(err)
	}
	return rules, data
}

// prometheusRuleHeader marks the generated file.
const prometheusRuleHeader = `# Generated from capstan.rules.yaml by
#   go test ./manifests/ -run TestPrometheusRuleMatchesRulesFile -update
# Do not edit. Apply it where the Prometheus Operator runs; set the labels
# your Prometheus's ruleSelector expects.
`

// The PrometheusRule is generated from the plain rules file; both ship the
// same rules.
func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	rules, _ := readRules(t)
	obj := map[string]any{
		"apiVersion": "monitoring.coreos.com/v1",
		"kind":       "PrometheusRule",
		"metadata": map[string]any{
			"name":      "capstan",
			"namespace": "capstan-system",
			"labels":    map[string]any{"app.kubernetes.io/name": "capstan", "app.kubernetes.io/component": "alerts"},
		},
		"spec": rules,
	}
	data, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte(prometheusRuleHeader), data...)
	if *update {
		if err := os.WriteFile(prometheusRuleFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(prometheusRuleFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from what %s generates; run go test ./manifests/ -run %s -update", prometheusRuleFile, rulesFile, t.Name())
	}

	// What the operator loads passes promtool too.
	var pr struct {
		APIVersion string              `json:"apiVersion"`
		Kind       string              `json:"kind"`
		Metadata   map[string]any      `json:"metadata"`
		Spec       promserver.RuleFile `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(got, &pr); err != nil {
		t.Fatalf("%s: %v", prometheusRuleFile, err)
	}
	spec, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "spec.yaml"), spec, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, dir, "check", "rules", "spec.yaml")
}

// Every alert is shipped, uses only metrics Capstan exports, and has a
// runbook in docs/alerts.md that its runbook_url points at.
func TestAlertRulesAreDocumentedAndUseExportedMetrics(t *testing.T) {
	rules, _ := readRules(t)
	exported := exportedMetrics(t)
	docs, err := os.ReadFile("../docs/alerts.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			seen[r.Alert] = true
			if unknown := unknownMetrics(r.Expr, exported); len(unknown) > 0 {
				t.Errorf("alert %s uses metrics the collector does not export: %v", r.Alert, unknown)
			}
			if !bytes.Contains(docs, []byte("\n## "+r.Alert+"\n")) {
				t.Errorf("docs/alerts.md has no section \"## %s\"", r.Alert)
			}
			if want := "docs/alerts.md#" + strings.ToLower(r.Alert); !strings.HasSuffix(r.Annotations["runbook_url"], want) {
				t.Errorf("alert %s: runbook_url %q, want it to end with %s", r.Alert, r.Annotations["runbook_url"], want)
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: want a severity label, a summary and a description", r.Alert)
			}
		}
	}
	for _, a := range shippedAlerts {
		if !seen[a] {
			t.Errorf("%s has no alert %s", rulesFile, a)
		}
	}
}

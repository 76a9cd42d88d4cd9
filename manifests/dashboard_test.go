package manifests_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/capstan-dev/capstan/internal/promserver"
	"github.com/capstan-dev/capstan/manifests"
)

type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID      int     `json:"id"`
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	GridPos *struct{ H, W, X, Y int } `json:"gridPos"`
}

func readDashboard(t *testing.T) (*dashboard, map[string]string) {
	t.Helper()
	data, err := manifests.Dashboards.ReadFile("dashboards/capstan.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("dashboards/capstan.json is not valid JSON: %v", err)
	}
	exprs := map[string]string{} // where -> PromQL
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for i, tgt := range p.Targets {
				if tgt.Expr != "" {
					exprs[fmt.Sprintf("panel %d %q target %d", p.ID, p.Title, i)] = tgt.Expr
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		var q struct {
			Query string `json:"query"`
		}
		if v.Type == "query" && json.Unmarshal(v.Query, &q) == nil {
			exprs["variable "+v.Name] = q.Query
		}
	}
	return &d, exprs
}

// The dashboard shows what the issue asks for, and every metric it queries
// is one Capstan exports.
func TestDashboardUsesExportedMetrics(t *testing.T) {
	d, exprs := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard needs a uid and a title, got %q and %q", d.UID, d.Title)
	}
	titles := map[string]bool{}
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			titles[strings.SplitN(p.Title, ":", 2)[0]] = true
			if ids[p.ID] {
				t.Errorf("panel id %d is used twice", p.ID)
			}
			ids[p.ID] = true
			if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 {
				t.Errorf("panel %q has no size", p.Title)
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, want := range []string{"Stage timeline", "Stuck stages", "Source freshness", "Reconcile errors"} {
		if !titles[want] {
			t.Errorf("dashboard has no panel %q", want)
		}
	}
	exported := exportedMetrics(t)
	used := 0
	for where, expr := range exprs {
		unknown := unknownMetrics(expr, exported)
		if len(unknown) > 0 {
			t.Errorf("%s uses metrics the collector does not export: %v", where, unknown)
		}
		used += len(metricName.FindAllString(expr, -1))
	}
	if used == 0 {
		t.Fatal("the dashboard queries no capstan_ metric")
	}
}

// Every query of the dashboard is valid PromQL: promtool checks them as
// recording rules, with Grafana's variables replaced by values.
func TestDashboardQueriesAreValidPromQL(t *testing.T) {
	_, exprs := readDashboard(t)
	vars := strings.NewReplacer(`"$namespace"`, `".*"`, `"$cluster"`, `"east"`, "$__rate_interval", "5m")
	var rules promserver.RuleFile
	group := promserver.RuleGroup{Name: "dashboard"}
	i := 0
	for where, expr := range exprs {
		if strings.HasPrefix(where, "variable ") {
			continue // label_values() is Grafana's, not PromQL
		}
		i++
		group.Rules = append(group.Rules, promserver.Rule{Record: fmt.Sprintf("dashboard:query_%d", i), Expr: vars.Replace(expr)})
	}
	rules.Groups = append(rules.Groups, group)
	data, err := yaml.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.rules.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, dir, "check", "rules", "dashboard.rules.yaml")
}

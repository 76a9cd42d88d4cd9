package promserver

import (
	"fmt"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// RuleFile is a Prometheus rules file.
type RuleFile struct {
	Groups []RuleGroup `json:"groups"`
}

// RuleGroup is one group of rules.
type RuleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []Rule `json:"rules"`
}

// Rule is an alerting or recording rule.
type Rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ParseRules reads a rules file strictly: an unknown field is an error.
func ParseRules(data []byte) (*RuleFile, error) {
	var f RuleFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("parse rules: %w", err)
	}
	return &f, nil
}

// OverrideFor returns a copy of a rules file whose alerts wait the given
// durations before firing instead of their own `for`, so that a test can
// see the shipped rules go from pending to firing in seconds. Every name in
// durations must be an alert of the file.
func OverrideFor(data []byte, durations map[string]time.Duration) ([]byte, error) {
	f, err := ParseRules(data)
	if err != nil {
		return nil, err
	}
	left := make(map[string]bool, len(durations))
	for name := range durations {
		left[name] = true
	}
	for g := range f.Groups {
		for r := range f.Groups[g].Rules {
			rule := &f.Groups[g].Rules[r]
			if d, ok := durations[rule.Alert]; ok {
				rule.For = d.String()
				delete(left, rule.Alert)
			}
		}
	}
	if len(left) > 0 {
		names := make([]string, 0, len(left))
		for n := range left {
			names = append(names, n)
		}
		return nil, fmt.Errorf("override for: no alert named %s", strings.Join(names, ", "))
	}
	return yaml.Marshal(f)
}

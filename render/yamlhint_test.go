package render

import (
	"strings"
	"testing"
)

// ${VAR} bare in a flow mapping is a YAML error before substitution: the
// error names the line and says to quote it or use block style; other
// YAML errors, and ${VAR} quoted or in block style, get no such hint.
func TestYAMLErrorHintsFlowSubstitution(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		hint       string // "" for none; else the line named
	}{
		{"flow mapping, one document", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: ${NS}}\n", "line 3 puts ${VAR} inside a flow mapping"},
		{"flow mapping after ---", "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: host-0, namespace: ${NS}-orion, labels: {a: b}}\ndata: {a: b}\n", "line 4 puts ${VAR}"},
		{"later document", "a: 1\n---\nb: 2\nc: {host: ${HOST}}\n", "line 4 puts ${VAR}"},
		{"flow list", "hosts: [a, ${HOST}]\n", "line 1 puts ${VAR}"},
		{"quoted is fine", "metadata: {name: a, namespace: \"${NS}\"}\nbad: [\n", ""},
		{"other syntax error", "a: b\n  c: d\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeDocuments([]byte(tc.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			has := strings.Contains(err.Error(), "quote the value, as \"${VAR}\", or write the mapping in block style")
			switch {
			case tc.hint == "" && has:
				t.Errorf("error has the substitution hint: %v", err)
			case tc.hint != "" && (!has || !strings.Contains(err.Error(), tc.hint)):
				t.Errorf("error = %v, want the hint naming %q", err, tc.hint)
			}
		})
	}
}

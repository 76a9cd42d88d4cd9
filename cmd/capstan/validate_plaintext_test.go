package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/capstan-dev/capstan/internal/sopstest"
	"github.com/capstan-dev/capstan/stages/preflight"
)

// encryptDotenvForAge encrypts a dotenv file as `sops encrypt --age`
// does, with the sops library (internal/sopstest).
func encryptDotenvForAge(t *testing.T, plain string, to *age.X25519Identity) string {
	t.Helper()
	return string(sopstest.MustEncrypt(t, sopstest.FormatDotenv, []byte(plain), "", sopstest.Age(to)))
}

// capstan validate warns about each Secret committed in plaintext, naming
// the object and its file (a document's file, or the kustomization whose
// secretGenerator reads plaintext), and not about a Secret encrypted with
// sops (a document or a generator's env file), with or without the key,
// nor about one annotated capstan.dev/plaintext: allowed. The warnings do
// not fail the command.
func TestValidatePlaintextSecrets(t *testing.T) {
	key := newIdentity(t)
	secret := func(name, annotations string) string {
		return "apiVersion: v1\nkind: Secret\nmetadata:\n  name: " + name + "\n  namespace: metal\n" + annotations + "stringData: {password: PLANTED-" + name + "}\n"
	}
	root := t.TempDir()
	files := map[string]string{
		"app/kustomization.yaml": "resources: [plain.yaml, sealed.yaml, allowed.yaml, settings.yaml]\n" +
			"secretGenerator:\n- name: gen-plain\n  namespace: metal\n  envs: [plain.env]\n- name: gen-sealed\n  namespace: metal\n  envs: [sealed.env]\n",
		"app/plain.yaml":    secret("bmc-plain", ""),
		"app/sealed.yaml":   encryptForAge(t, secret("bmc-sealed", ""), "^(data|stringData)$", key),
		"app/allowed.yaml":  secret("bmc-allowed", "  annotations: {capstan.dev/plaintext: allowed}\n"),
		"app/settings.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: metal}\ndata: {a: b}\n",
		"app/plain.env":     "PASSWORD=PLANTED-gen-plain\n",
		"app/sealed.env":    encryptDotenvForAge(t, "PASSWORD=PLANTED-gen-sealed\n", key),
		"key.txt":           key.String() + "\n",
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(sopsAgeKeyFileEnv, "")
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"without a key", nil},
		{"with the key", []string{"--decryption-key", filepath.Join(root, "key.txt")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"validate", "--root", root, "app"}, tc.args...)
			out, err := runCLI(t, append(args, "-o", "json")...)
			if err != nil {
				t.Fatalf("validate failed on warnings alone: %v\n%s", err, out)
			}
			var report preflight.Report
			if err := json.Unmarshal([]byte(out), &report); err != nil {
				t.Fatalf("%v:\n%s", err, out)
			}
			warned := map[string]string{} // object: message
			for _, p := range report.Problems {
				if !p.Warning {
					t.Errorf("unexpected error %s", p.Line())
					continue
				}
				name := p.Object
				if strings.HasPrefix(name, "Secret metal/gen-plain-") {
					name = "Secret metal/gen-plain" // the hash suffix
				}
				warned[name] = p.Message
			}
			want := map[string]string{"Secret metal/bmc-plain": "(in app/plain.yaml)", "Secret metal/gen-plain": "(in app/kustomization.yaml)"}
			for object, file := range want {
				if msg, ok := warned[object]; !ok || !strings.HasSuffix(msg, file) || !strings.Contains(msg, "capstan.dev/plaintext: allowed") {
					t.Errorf("%s: warning %q, want one naming %s and the opt-out", object, msg, file)
				}
			}
			if len(warned) != len(want) {
				t.Errorf("warnings about %v, want only %v", warned, want)
			}
			if strings.Contains(out, "PLANTED") {
				t.Errorf("the report shows a value:\n%s", out)
			}
			// As text, the warnings of one cause share a line.
			out, err = runCLI(t, args...)
			if err != nil || !strings.Contains(out, "WARNING 2 objects (Secret metal/bmc-plain") || !strings.Contains(out, "0 errors, 2 warnings") {
				t.Errorf("text: %v; want the two warnings grouped:\n%s", err, out)
			}
		})
	}
}

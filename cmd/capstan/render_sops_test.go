package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/capstan-dev/capstan/internal/sopstest"
)

// encryptForAge encrypts a YAML file as `sops encrypt --age` does, with
// the sops library (internal/sopstest), the fields matching regex.
func encryptForAge(t *testing.T, plain, regex string, to *age.X25519Identity) string {
	t.Helper()
	return string(sopstest.MustEncrypt(t, sopstest.FormatYAML, []byte(plain), regex, sopstest.Age(to)))
}

// capstan render decrypts only with --decryption-key or
// $SOPS_AGE_KEY_FILE, masks decrypted values (of a Secret and of any
// other document) unless --show-secrets, and names the file and the
// recipient when the key is the wrong one.
func TestRenderDecryptsOnlyWithAKey(t *testing.T) {
	key, other := newIdentity(t), newIdentity(t)
	const secretValue, docValue = "PLANTED-bmc-password", "PLANTED-registry-token"
	root := t.TempDir()
	files := map[string]string{
		"app/kustomization.yaml": "resources: [bmc.yaml, mirror.yaml]\n",
		"app/bmc.yaml": encryptForAge(t, "apiVersion: v1\nkind: Secret\nmetadata: {name: bmc, namespace: ns}\nstringData: {password: "+secretValue+"}\n",
			"^(data|stringData)$", key),
		"app/mirror.yaml": encryptForAge(t, "apiVersion: example.capstan.dev/v1\nkind: Mirror\nmetadata: {name: m, namespace: ns}\nspec: {token: "+docValue+"}\n",
			"^spec$", key),
		"key.txt":   "# created by the test\n" + key.String() + "\n",
		"other.txt": other.String() + "\n",
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
	args := []string{"render", "--root", root, "app"}

	out, err := runCLI(t, args...)
	if err != nil || !strings.Contains(out, "ENC[AES256_GCM") || strings.Contains(out, "PLANTED") {
		t.Errorf("without a key: %v; want the ciphertext as in git:\n%s", err, out)
	}
	out, err = runCLI(t, append(args, "--decryption-key", filepath.Join(root, "key.txt"))...)
	if err != nil || strings.Contains(out, "PLANTED") || strings.Contains(out, "ENC[") || !strings.Contains(out, "masked") {
		t.Errorf("with --decryption-key: %v; want decrypted values masked:\n%s", err, out)
	}
	out, err = runCLI(t, append(args, "--decryption-key", filepath.Join(root, "key.txt"), "--show-secrets")...)
	if err != nil || !strings.Contains(out, secretValue) || !strings.Contains(out, docValue) {
		t.Errorf("with --show-secrets: %v; want both plaintexts:\n%s", err, out)
	}
	t.Setenv(sopsAgeKeyFileEnv, filepath.Join(root, "key.txt"))
	out, err = runCLI(t, append(args, "--show-secrets")...)
	if err != nil || !strings.Contains(out, secretValue) {
		t.Errorf("with $%s: %v; want the plaintext:\n%s", sopsAgeKeyFileEnv, err, out)
	}
	out, err = runCLI(t, append(args, "--decryption-key", filepath.Join(root, "other.txt"))...)
	if err == nil || !strings.Contains(err.Error(), "app/bmc.yaml") || !strings.Contains(err.Error(), key.Recipient().String()) {
		t.Errorf("with the wrong key: %v; want an error naming the file and the recipient:\n%s", err, out)
	}
	if err != nil && strings.Contains(err.Error(), "AGE-SECRET-KEY") {
		t.Errorf("the error quotes a key: %v", err)
	}
}

func newIdentity(t *testing.T) *age.X25519Identity { return sopstest.NewAgeKey(t) }

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capstan-dev/capstan/internal/sopstest"
	"github.com/capstan-dev/capstan/render"
)

// sopsencrypt encrypts a plaintext Secret file in place for the key
// file's recipient (only data and stringData: the identity stays
// readable), render opens it with that key, and a second run leaves the
// encrypted file as it is.
func TestEncryptInPlaceOnce(t *testing.T) {
	dir := t.TempDir()
	id := sopstest.NewAgeKey(t)
	keyFile := filepath.Join(dir, "demo.agekey")
	if err := os.WriteFile(keyFile, sopstest.AgeKeyFile(id), 0o600); err != nil {
		t.Fatal(err)
	}
	const plain = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: bmc\nstringData:\n  password: PLANTED-sopsencrypt\n"
	file := filepath.Join(dir, "bmc.yaml")
	if err := os.WriteFile(file, []byte(plain), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-key", keyFile, file}); err != nil {
		t.Fatal(err)
	}
	enc, _ := os.ReadFile(file)
	if strings.Contains(string(enc), "PLANTED") || !strings.Contains(string(enc), "name: bmc") || !sopstest.IsEncrypted(enc) {
		t.Fatalf("not encrypted as sops encrypt --encrypted-regex '^(data|stringData)$' would:\n%s", enc)
	}
	keys, err := render.ParseKeys(map[string][]byte{"demo.agekey": sopstest.AgeKeyFile(id)})
	if err != nil {
		t.Fatal(err)
	}
	back, err := render.DecryptFile("bmc.yaml", enc, keys)
	if err != nil || !strings.Contains(string(back), "password: PLANTED-sopsencrypt") {
		t.Fatalf("render cannot open it: %v\n%s", err, back)
	}
	if err := run([]string{"-key", keyFile, file}); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(file); string(again) != string(enc) {
		t.Error("a second run changed the encrypted file")
	}
	if err := run([]string{file}); err == nil {
		t.Error("no -key: want the usage error")
	}
}

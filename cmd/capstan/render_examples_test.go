package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// The examples' BMC credentials are committed encrypted for the demo key
// beside them: rendered without a key they are ciphertext, with
// --decryption-key the demo key opens them (masked, or shown with
// --show-secrets), and validate finds no Secret committed in plaintext
// in any example.
func TestExamplesSecretsAreEncryptedForTheDemoKey(t *testing.T) {
	const key = "../../examples/DEMO-KEY-NOT-SECRET.agekey"
	for cluster, host := range map[string]string{"mgmt": "mgmt-cp-0", "workload-east": "workload-east-worker-2", "bootstrap": "iam-admin"} {
		file := "../../examples/clusters/" + cluster + "/clusterdeployment.yaml"
		out, err := runCLI(t, "render", "--root", "../../examples", "-f", file)
		if err != nil {
			t.Fatalf("render %s: %v", cluster, err)
		}
		if !strings.Contains(out, "ENC[AES256_GCM,") || strings.Contains(out, "demo-password-") {
			t.Errorf("render %s without a key: want the BMC Secrets as ciphertext:\n%s", cluster, out)
		}
		out, err = runCLI(t, "render", "--root", "../../examples", "-f", file, "--decryption-key", key)
		if err != nil {
			t.Fatalf("render %s --decryption-key: %v", cluster, err)
		}
		if strings.Contains(out, "ENC[") || strings.Contains(out, "demo-password-") || !strings.Contains(out, maskedValue) {
			t.Errorf("render %s --decryption-key: want the values decrypted and masked:\n%s", cluster, out)
		}
		out, err = runCLI(t, "render", "--root", "../../examples", "-f", file, "--decryption-key", key, "--show-secrets")
		if err != nil || !strings.Contains(out, "password: demo-password-"+host) {
			// (bootstrap: the new cluster's IAM admin, in overlay/target)
			t.Errorf("render %s --decryption-key --show-secrets: want the password of %s: %v\n%s", cluster, host, err, out)
		}
	}
	files, err := filepath.Glob("../../examples/clusters/*/*clusterdeployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		out, err := runCLI(t, "validate", "--root", "../../examples", "-f", file)
		if err != nil || strings.Contains(out, "plaintext") {
			t.Errorf("validate %s: want no plaintext warning: %v\n%s", file, err, out)
		}
	}
}

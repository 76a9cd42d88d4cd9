package stages_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// A document render decrypted from a sops file is a secret whatever its
// kind: its field diff says which fields change, never their values; its
// labels still show.
func TestFieldDiffsHideDecryptedDocuments(t *testing.T) {
	obj := func(password, team string, decrypted bool) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "example.capstan.dev/v1", "kind": "RegistryCredential",
			"metadata": map[string]any{"name": "mirror", "labels": map[string]any{"team": team}},
			"spec":     map[string]any{"password": password, "server": "registry.example.com"},
		}}
		if decrypted {
			u.SetAnnotations(map[string]string{capstanv1.DecryptedAnnotation: "true"})
		}
		return u
	}
	live := obj("old-PLANTED-secret", "a", true)
	applied := obj("new-PLANTED-secret", "b", true)
	var spec, label bool
	for _, f := range stages.FieldDiffs(live, applied) {
		if strings.Contains(f.String(), "PLANTED") {
			t.Errorf("a decrypted value shows: %s", f)
		}
		if f.Path == "spec.password" {
			spec = f.Redacted
		}
		if f.Path == "metadata.labels.team" {
			label = !f.Redacted
		}
	}
	if !spec || !label {
		t.Errorf("spec.password redacted %v, label shown %v; want both", spec, label)
	}
	// Without the mark the same document shows its values, as before.
	shown := false
	for _, f := range stages.FieldDiffs(obj("old-PLANTED-secret", "a", false), obj("new-PLANTED-secret", "a", false)) {
		shown = shown || strings.Contains(f.String(), "new-PLANTED-secret")
	}
	if !shown {
		t.Error("an ordinary document's values are hidden")
	}
}

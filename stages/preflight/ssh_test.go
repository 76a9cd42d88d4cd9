package preflight_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/capstan-dev/capstan/stages/preflight"
)

// kubeadmUsers is a KubeadmControlPlane whose kubeadm users carry keys.
func kubeadmUsers(keys ...any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
		"kind":       "KubeadmControlPlane",
		"metadata":   map[string]any{"name": "edge", "namespace": "capstan-system"},
		"spec": map[string]any{"kubeadmConfigSpec": map[string]any{"users": []any{
			map[string]any{"name": "ops", "sshAuthorizedKeys": keys},
		}}},
	}}
}

// A network ConfigMap without keys is not warned about when the
// KubeadmControlPlane's users carry keys themselves; it still is when
// they carry none.
func TestSSHKeysOfKubeadmUsersCount(t *testing.T) {
	for _, tc := range []struct {
		name    string
		objects []*unstructured.Unstructured
		warn    bool
	}{
		{"no keys anywhere", []*unstructured.Unstructured{network(with("sshAuthorizedKeys", "-"))}, true},
		{"the control plane's users carry a key", []*unstructured.Unstructured{network(with("sshAuthorizedKeys", "-")), kubeadmUsers(sshKey)}, false},
		{"the control plane's users carry none", []*unstructured.Unstructured{network(with("sshAuthorizedKeys", "-")), kubeadmUsers()}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			report := preflight.Validate(tc.objects)
			warned := false
			for _, p := range report.Warnings() {
				warned = warned || p.Field == "data.sshAuthorizedKeys"
			}
			if warned != tc.warn {
				t.Errorf("warned about missing SSH keys = %v, want %v:\n%s", warned, tc.warn, report.Lines())
			}
		})
	}
}

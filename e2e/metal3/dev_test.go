package metal3

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/capstan-dev/capstan/stages"
)

// The README's `capstan dev --providers real`, run as a user runs it: its
// own control plane with the real providers, examples/ from a local git
// repository with each cluster's endpoint moved to 127.0.0.1, and exit 0
// once mgmt is Ready, every capm3 stage shown becoming ready in order.
func TestDevWithRealProviders(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second control plane and the providers")
	}
	bin := filepath.Join(t.TempDir(), "capstan")
	build := exec.Command("go", "build", "-o", bin, "./cmd/capstan")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	begin := time.Now()
	dev := exec.CommandContext(ctx, bin, "dev", "--providers", "real", "--exit-when-ready", "--timeout", "10m")
	dev.Dir = filepath.Join("..", "..")
	out, err := dev.CombinedOutput()
	if err != nil {
		t.Fatalf("capstan dev --providers real: %v\n%s", err, out)
	}
	t.Logf("capstan dev --providers real --exit-when-ready: exit 0 after %s", time.Since(begin).Round(100*time.Millisecond))

	text := string(out)
	for _, want := range []string{
		"clusters/mgmt/clusterdeployment.yaml: API server at 127.0.0.1:",
		"real providers and reconciler running",
		"MGMT STAGE",
		"mgmt is Ready",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	profile, err := stages.LoadProfile("capm3")
	if err != nil {
		t.Fatal(err)
	}
	at := 0
	for _, s := range profile.Stages {
		i := strings.Index(text[at:], "✓ mgmt "+s.Name)
		if i < 0 {
			t.Fatalf("output does not show %s becoming ready after the stages before it:\n%s", s.Name, out)
		}
		at += i
	}
}

// createDemoKeySecret creates in ns the Secret the example
// ClusterDeployments name in spec.decryption, holding the examples' demo
// age key, as capstan dev does in its own namespace.
func createDemoKeySecret(t *testing.T, ns string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "examples", "DEMO-KEY-NOT-SECRET.agekey"))
	if err != nil {
		t.Fatal(err)
	}
	if err := newClient(t).Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sops-age", Namespace: ns},
		Data: map[string][]byte{"demo.agekey": raw}}); err != nil {
		t.Fatal(err)
	}
}

package cluster

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestKindCheckSaysWhyKindCannotRun pins the precondition check's answers:
// it names the step that failed and what to do, and never lets a suite
// skip silently.
func TestKindCheckSaysWhyKindCannotRun(t *testing.T) {
	t.Run("no docker CLI", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		err := (&Kind{}).Check(t.Context())
		if !errors.Is(err, ErrNoDockerCLI) || !strings.Contains(err.Error(), "apt-get install docker.io") {
			t.Fatalf("Check = %v, want ErrNoDockerCLI with how to install it", err)
		}
	})
	t.Run("no daemon at DOCKER_HOST", func(t *testing.T) {
		if _, err := exec.LookPath("docker"); err != nil {
			t.Fatalf("this row needs the docker CLI (the machine's image has it): %v", err)
		}
		sock := "unix://" + filepath.Join(t.TempDir(), "docker.sock")
		t.Setenv("DOCKER_HOST", sock)
		err := (&Kind{}).Check(t.Context())
		if !errors.Is(err, ErrDockerUnreachable) || !strings.Contains(err.Error(), sock) {
			t.Fatalf("Check = %v, want ErrDockerUnreachable naming %s", err, sock)
		}
		if !strings.Contains(err.Error(), "CAPSTAN_E2E_BACKEND=local") {
			t.Errorf("Check = %v; it should point at the local backend", err)
		}
	})
}

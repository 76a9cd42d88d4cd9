package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// A run's workspace and kubeconfig go, with the directories made for the
// kubeconfig, when it closes; the kubeconfig's context defaults to the
// demo's namespace.
func TestDevWorkspaceRemovesWhatItMade(t *testing.T) {
	tmp, home := t.TempDir(), t.TempDir()
	t.Setenv("TMPDIR", tmp)
	path := filepath.Join(home, ".cache", "capstan", "dev", "kubeconfig")
	ws, err := newDevWorkspace(path)
	if err != nil {
		t.Fatal(err)
	}
	if ws.Kubeconfig != path || ws.Fallback != "" {
		t.Fatalf("kubeconfig %s (%s), want %s", ws.Kubeconfig, ws.Fallback, path)
	}
	cfg := &rest.Config{Host: "https://127.0.0.1:6443", BearerToken: "t0ken"}
	if err := ws.WriteKubeconfig([]devKubeContext{{Name: devContext, Config: cfg}, {Name: devContext + "-target", Config: cfg}}); err != nil {
		t.Fatal(err)
	}
	raw, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if raw.CurrentContext != devContext || raw.Contexts[devContext].Namespace != devNamespace || raw.Contexts[devContext+"-target"] == nil {
		t.Errorf("kubeconfig: current context %q, contexts %v; want %s current with namespace %s, and the target's", raw.CurrentContext, raw.Contexts, devContext, devNamespace)
	}
	if err := os.WriteFile(ws.Path("artifacts"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ws.Close(); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{tmp, home} {
		if left, _ := os.ReadDir(dir); len(left) > 0 {
			t.Errorf("%s holds %v after Close, want nothing", dir, left)
		}
	}
}

// A second run while the first holds the kubeconfig writes its own into
// its workspace and says why; neither removes the other's.
func TestDevKubeconfigOfASecondRun(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	path := filepath.Join(t.TempDir(), "dev", "kubeconfig")
	first, err := newDevWorkspace(path)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := newDevWorkspace(path)
	if err != nil {
		t.Fatal(err)
	}
	if second.Kubeconfig != second.Path("kubeconfig") || !strings.Contains(second.Fallback, "another capstan dev is using "+path) {
		t.Errorf("second run: kubeconfig %s (%q), want one in its workspace saying another run uses %s", second.Kubeconfig, second.Fallback, path)
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("the second run's exit removed the first's kubeconfig: %v", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(path)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is left after both runs: %v", filepath.Dir(path), err)
	}
	third, err := newDevWorkspace(path)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	if third.Kubeconfig != path {
		t.Errorf("a run after both: kubeconfig %s (%q), want %s", third.Kubeconfig, third.Fallback, path)
	}
}

// A run killed before it could clean up leaves its workspace; the next
// run removes it, and leaves those of runs still alive.
func TestDevSweepsWorkspacesOfDeadRuns(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	for name, pid := range map[string]int{"capstan-dev-dead": gone.Process.Pid, "capstan-dev-alive": os.Getpid()} {
		if err := os.MkdirAll(filepath.Join(tmp, name, "controlplane"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, name, "pid"), []byte(strconv.Itoa(pid)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ws, err := newDevWorkspace("")
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if _, err := os.Stat(filepath.Join(tmp, "capstan-dev-dead")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the workspace of a dead run is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(tmp, "capstan-dev-alive")); err != nil {
		t.Errorf("the workspace of a live run was removed: %v", err)
	}
}

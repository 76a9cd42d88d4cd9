package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// testWriter sends progress lines to t.Log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestStartStop starts a second, minimal control plane, uses it through the
// kubeconfig it wrote, and checks that Stop leaves no process, port or
// directory behind.
func TestStartStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	begin := time.Now()
	e, err := Start(ctx, Options{Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Start without kube-controller-manager took %s", time.Since(begin))
	stopped := false
	defer func() {
		if !stopped {
			e.Stop()
		}
	}()

	cfg, err := clientcmd.BuildConfigFromFlags("", e.KubeconfigPath)
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	version, err := client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("get server version: %v", err)
	}
	if version.GitVersion != KubernetesVersion {
		t.Errorf("server version = %s, want %s", version.GitVersion, KubernetesVersion)
	}
	ns, err := e.CreateNamespace(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hello"}, Data: map[string]string{"a": "b"}}
	if _, err := client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ConfigMap through the kubeconfig: %v", err)
	}

	procs := []*process{e.etcd, e.apiServer}
	apiAddr := strings.TrimPrefix(e.apiServerURL, "https://")
	stopBegin := time.Now()
	if err := e.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	stopped = true
	t.Logf("Stop took %s", time.Since(stopBegin))

	for _, p := range procs {
		if err := syscall.Kill(p.pid(), 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) still there after Stop: kill -0 says %v", p.name, p.pid(), err)
		}
	}
	if conn, err := net.DialTimeout("tcp", apiAddr, time.Second); err == nil {
		conn.Close()
		t.Errorf("kube-apiserver port %s still open after Stop", apiAddr)
	}
	if _, err := os.Stat(e.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary dir %s still there after Stop: %v", e.Dir, err)
	}
	if err := e.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestServerVersion(t *testing.T) {
	client := kubernetes.NewForConfigOrDie(env.Config)
	version, err := client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("get server version: %v", err)
	}
	if version.GitVersion != KubernetesVersion {
		t.Errorf("server version = %s, want %s", version.GitVersion, KubernetesVersion)
	}
}

func TestCreateNamespaceAndConfigMap(t *testing.T) {
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if want := "testcreatenamespaceandconfigmap-"; !strings.HasPrefix(ns, want) {
		t.Errorf("namespace %q does not start with %q", ns, want)
	}
	client := kubernetes.NewForConfigOrDie(env.Config)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hello"}, Data: map[string]string{"greeting": "hi"}}
	if _, err := client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ConfigMap: %v", err)
	}
	got, err := client.CoreV1().ConfigMaps(ns).Get(ctx, "hello", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get ConfigMap: %v", err)
	}
	if got.Data["greeting"] != "hi" {
		t.Errorf("ConfigMap data = %v, want greeting=hi", got.Data)
	}
}

func TestNamespacePrefix(t *testing.T) {
	tests := []struct{ in, want string }{
		{"plain", "plain-"},
		{"ends-", "ends-"},
		{"TestApply/prunes_orphans", "testapply-prunes-orphans-"},
		{"--__--", "test-"},
		{strings.Repeat("a", 100), strings.Repeat("a", maxNamespacePrefix) + "-"},
	}
	for _, tt := range tests {
		if got := namespacePrefix(tt.in); got != tt.want {
			t.Errorf("namespacePrefix(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestStartFailureQuotesLog starts an "etcd" that fails at once and expects
// its output in the error and nothing left running.
func TestStartFailureQuotesLog(t *testing.T) {
	binDir := t.TempDir()
	script := "#!/bin/sh\necho 'etcd: cannot open data dir: disk on fire' >&2\nexit 3\n"
	for _, name := range binaries {
		if err := os.WriteFile(filepath.Join(binDir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "env")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := Start(ctx, Options{BinDir: binDir, Dir: dir})
	if err == nil {
		t.Fatal("Start with a failing etcd succeeded")
	}
	for _, want := range []string{"disk on fire", "exit status 3", "etcd.log"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	t.Logf("Start error:\n%v", err)
	if _, statErr := os.Stat(filepath.Join(dir, "etcd.log")); statErr != nil {
		t.Errorf("a given Dir must be kept with its logs: %v", statErr)
	}
}

func TestEnsureBinariesUsesEnvDir(t *testing.T) {
	t.Setenv(binDirEnv, env.binDir)
	got, err := EnsureBinaries(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got != env.binDir {
		t.Errorf("EnsureBinaries = %s, want %s", got, env.binDir)
	}
}

// TestKubernetesVersionMatchesTestbin keeps the fallback version in step
// with what build.sh builds.
func TestKubernetesVersionMatchesTestbin(t *testing.T) {
	script, err := findBuildScript()
	if err != nil {
		t.Fatal(err)
	}
	got, err := testbinVersion(filepath.Join(filepath.Dir(script), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if got != KubernetesVersion {
		t.Errorf("e2e/testbin builds %s, KubernetesVersion is %s", got, KubernetesVersion)
	}
}

// TestStartOnFreePortsRetriesTakenPorts pins the retry policy: a port taken
// before the binary bound it is retried on other ports, any other failure is
// returned at once.
func TestStartOnFreePortsRetriesTakenPorts(t *testing.T) {
	tests := []struct {
		name      string
		failures  []error // returned by successive starts, then success
		wantCalls int
		wantErr   bool
	}{
		{"first start works", nil, 1, false},
		{"taken port is retried", []error{errAddrInUse}, 2, false},
		{"other failures are not retried", []error{errors.New("bad flag")}, 1, true},
		{"gives up after portAttempts", []error{errAddrInUse, errAddrInUse, errAddrInUse}, portAttempts, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			_, err := startOnFreePorts(t.Context(), 2, func(ports []int) (*process, error) {
				calls++
				if len(ports) != 2 || ports[0] == ports[1] {
					t.Errorf("ports = %v, want two distinct ports", ports)
				}
				if calls <= len(tt.failures) {
					return nil, fmt.Errorf("start etcd: %w", tt.failures[calls-1])
				}
				return &process{}, nil
			})
			if calls != tt.wantCalls {
				t.Errorf("start called %d times, want %d", calls, tt.wantCalls)
			}
			if (err != nil) != tt.wantErr {
				t.Errorf("error = %v, want error: %v", err, tt.wantErr)
			}
		})
	}
}

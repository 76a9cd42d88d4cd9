package stages_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluxcd/pkg/ssa"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

const secretToken = "s3cr3t-t0ken-never-shown"

// kubeconfigFor writes a kubeconfig for server with secretToken, trusting
// the CAs of caPEM (none: the system's).
func kubeconfigFor(t testing.TB, server string, caPEM ...byte) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: secretToken}
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "x"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// closedPort returns an address on loopback that nothing listens on.
func closedPort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

func TestKubeconfigClusterRefusesBadKubeconfigsWithoutQuotingThem(t *testing.T) {
	good := string(kubeconfigFor(t, "https://127.0.0.1:6443"))
	for _, tc := range []struct {
		name, kubeconfig, want string
	}{
		{"empty", "", "it is empty"},
		{"not YAML", "token: " + secretToken + "\n  : [", "does not parse"},
		{"a list where a map belongs", "users: " + secretToken, "does not parse"},
		{"no current context", strings.Replace(good, "current-context: x", "current-context: \"\"", 1), "no current-context"},
		{"current context missing", strings.Replace(good, "current-context: x", "current-context: other", 1), `current-context "other"`},
		{"no server", strings.Replace(good, "server: https://127.0.0.1:6443", "server: \"\"", 1), "has no server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := stages.NewKubeconfigCluster("Secret ns/k", []byte(tc.kubeconfig), scheme.Scheme)
			if err == nil {
				t.Fatal("NewKubeconfigCluster accepted it")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if strings.Contains(err.Error(), secretToken) {
				t.Errorf("error %q quotes the kubeconfig's token", err)
			}
		})
	}
}

// TestExecutorOnKubeconfigCluster: an executor On a connection built from
// a kubeconfig applies and waits there, with Capstan's field manager.
func TestExecutorOnKubeconfigCluster(t *testing.T) {
	ns := newNamespace(t)
	data, err := os.ReadFile(env.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	remote, err := stages.NewKubeconfigCluster("Secret "+ns+"/target-kubeconfig", data, scheme.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.CheckAvailable(testContext(t)); err != nil {
		t.Fatalf("CheckAvailable = %v, want the test control plane to answer", err)
	}
	e := stages.NewExecutor(nil).On(remote)
	if e.Cluster().Name() != "Secret "+ns+"/target-kubeconfig" {
		t.Errorf("executor acts on %q", e.Cluster().Name())
	}
	stage := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Remote", Action: capstanv1.StageActionApply},
		Objects: []*unstructured.Unstructured{configMap(ns, "remote", map[string]any{"a": "b"})}}
	res := e.Run(testContext(t), stage, owner, stages.RunOptions{})
	if res.State != capstanv1.StageReady {
		t.Fatalf("Run = %s: %s", res.State, res.Message)
	}
	if got := actions(res.ChangeSet)["ConfigMap/"+ns+"/remote"]; got != ssa.CreatedAction {
		t.Errorf("change set = %v, want the ConfigMap created", actions(res.ChangeSet))
	}
	c, _ := newClient(t)
	live := getLive(t, c, configMap(ns, "remote", nil))
	var managers []string
	for _, f := range live.GetManagedFields() {
		managers = append(managers, f.Manager)
	}
	if !slices.Contains(managers, stages.FieldManager) {
		t.Errorf("field managers %v, want %s", managers, stages.FieldManager)
	}
}

// TestExecutorOnUnreachableClusterWaits: a cluster nothing answers for is
// waited for, not failed, and the message names it and the cause.
func TestExecutorOnUnreachableClusterWaits(t *testing.T) {
	remote, err := stages.NewKubeconfigCluster("Secret ns/down-kubeconfig", kubeconfigFor(t, "https://"+closedPort(t)), scheme.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	e := stages.NewExecutor(nil).On(remote)
	stage := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Remote", Action: capstanv1.StageActionApply},
		Objects: []*unstructured.Unstructured{configMap("default", "remote", map[string]any{"a": "b"})}}
	for name, res := range map[string]stages.Result{
		"ApplyStage": e.ApplyStage(testContext(t), stage, owner),
		"WaitStage":  e.WaitStage(testContext(t), stage, owner),
	} {
		if res.State != capstanv1.StageInProgress || !stages.IsUnreachable(res.Err) || stages.IsStalled(res.Err) {
			t.Errorf("%s = %s (err %v), want InProgress waiting for the cluster", name, res.State, res.Err)
		}
		for _, want := range []string{"cluster of Secret ns/down-kubeconfig unreachable", "connection refused"} {
			if !strings.Contains(res.Message, want) {
				t.Errorf("%s message %q does not say %q", name, res.Message, want)
			}
		}
		if strings.Contains(res.Message, secretToken) {
			t.Errorf("%s message %q holds the token", name, res.Message)
		}
	}
}

// cuttableProxy forwards TCP connections to addr until cut, which closes
// the listener and every connection: a cluster that goes away.
type cuttableProxy struct {
	listener net.Listener
	mu       sync.Mutex
	conns    []net.Conn
}

func startProxy(t testing.TB, addr string) *cuttableProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttableProxy{listener: l}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				_ = in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	t.Cleanup(p.cut)
	return p
}

func (p *cuttableProxy) cut() {
	_ = p.listener.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

// TestWaitOnClusterThatGoesAway: a remote cluster that goes away while a
// stage waits on its watches is reported as unreachable at once, not when
// the wait's deadline passes.
func TestWaitOnClusterThatGoesAway(t *testing.T) {
	ns := newNamespace(t)
	data, err := os.ReadFile(env.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.Load(data)
	if err != nil {
		t.Fatal(err)
	}
	var proxy *cuttableProxy
	for _, c := range kc.Clusters {
		u, err := url.Parse(c.Server)
		if err != nil {
			t.Fatal(err)
		}
		proxy = startProxy(t, u.Host)
		c.Server = "https://" + proxy.listener.Addr().String()
	}
	data, err = clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	remote, err := stages.NewKubeconfigCluster("Secret "+ns+"/leaving-kubeconfig", data, scheme.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	e := stages.NewExecutor(nil).On(remote)
	stage := &stages.Stage{
		StageSpec: capstanv1.StageSpec{Name: "Remote", Action: capstanv1.StageActionApply, ReadyWhen: []capstanv1.ReadinessCheck{{
			Kind: "ConfigMap", CEL: "has(object.metadata.annotations)",
		}}},
		Objects: []*unstructured.Unstructured{configMap(ns, "leaving", map[string]any{"a": "b"})},
	}
	if res := e.ApplyStage(testContext(t), stage, owner); res.State != capstanv1.StageInProgress || res.Err != nil {
		t.Fatalf("ApplyStage = %s: %s", res.State, res.Message)
	}
	ctx, cancel := context.WithTimeout(testContext(t), 30*time.Second)
	defer cancel()
	done := make(chan stages.Result, 1)
	go func() { done <- e.WaitStage(ctx, stage, owner) }()
	time.Sleep(time.Second) // listed and watching
	cutAt := time.Now()
	proxy.cut()
	res := <-done
	if res.State != capstanv1.StageInProgress || !stages.IsUnreachable(res.Err) {
		t.Fatalf("WaitStage = %s (err %v, message %q), want InProgress waiting for the cluster", res.State, res.Err, res.Message)
	}
	if ctx.Err() != nil {
		t.Errorf("WaitStage returned at its deadline (%s after the cut), want as soon as the cluster went away", time.Since(cutAt))
	}
	if !strings.Contains(res.Message, "cluster of Secret "+ns+"/leaving-kubeconfig unreachable") {
		t.Errorf("message %q does not name the cluster's Secret", res.Message)
	}
}

func TestIsNetworkError(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused, wrapped by the client", &url.Error{Op: "Get", URL: "https://127.0.0.1:1/version", Err: refused}, true},
		{"a name that does not resolve", &net.DNSError{Err: "no such host", Name: "mgmt.example"}, true},
		{"an unknown certificate authority", fmt.Errorf("get: %w", x509.UnknownAuthorityError{}), true},
		{"a timeout that lost its type", errors.New("failed to get API group resources: dial tcp 10.0.0.1:6443: i/o timeout"), true},
		{"the server refusing the object", apierrors.NewInvalid(schema.GroupKind{Kind: "ConfigMap"}, "x", nil), false},
		{"the server quoting a webhook's TLS error", apierrors.NewInternalError(errors.New("calling webhook: tls: failed to verify certificate")), false},
		{"the context's own deadline", context.DeadlineExceeded, false},
		{"nothing", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stages.IsNetworkError(tc.err); got != tc.want {
				t.Errorf("isNetworkError(%v) = %t, want %t", tc.err, got, tc.want)
			}
		})
	}
}

// TestExecutorOnSilentClusterWaits: a server that accepts connections but
// never answers is unreachable after the availability check's bound, not
// after the dialer's or the attempt's.
func TestExecutorOnSilentClusterWaits(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	remote, err := stages.NewKubeconfigCluster("Secret ns/silent-kubeconfig", kubeconfigFor(t, "https://"+l.Addr().String()), scheme.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	stage := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Remote", Action: capstanv1.StageActionApply},
		Objects: []*unstructured.Unstructured{configMap("default", "silent", map[string]any{"a": "b"})}}
	res := stages.NewExecutor(nil).On(remote).ApplyStage(testContext(t), stage, owner)
	if res.State != capstanv1.StageInProgress || !stages.IsUnreachable(res.Err) {
		t.Fatalf("ApplyStage = %s (err %v), want InProgress waiting for the cluster", res.State, res.Err)
	}
	if want := "cluster of Secret ns/silent-kubeconfig unreachable: no answer to GET /version within 5s"; res.Message != want {
		t.Errorf("message %q, want %q", res.Message, want)
	}
}

package stages_test

import (
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/fluxcd/pkg/ssa"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

const secretToken = "s3cr3t-t0ken-never-shown"

// kubeconfigFor writes a kubeconfig for server with secretToken.
func kubeconfigFor(t testing.TB, server string) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: server, InsecureSkipTLSVerify: true}
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

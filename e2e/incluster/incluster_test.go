package incluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/manifests"
	"github.com/capstan-dev/capstan/reconciler"
)

// waitTimeout bounds every wait; pods start in seconds on the local node.
const waitTimeout = 3 * time.Minute

const (
	capstanNS = manifests.Namespace
	appNS     = "incluster-demo"
	repoName  = "infra"
)

// demoFiles is the root repository: one ClusterDeployment under clusters/
// whose overlay creates a namespace and a ConfigMap in one stage, and,
// with gate, a second stage that waits until the test opens the gate.
func demoFiles(gate bool) map[string]string {
	stages := "  stages:\n    - name: Config\n"
	resources := "resources: [namespace.yaml, config.yaml]\n"
	files := map[string]string{
		"apps/demo/namespace.yaml": "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: " + appNS + "\n  labels: {capstan.dev/stage: Config}\n",
		"apps/demo/config.yaml":    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: " + appNS + "\n  labels: {capstan.dev/stage: Config}\ndata: {podCIDR: 10.233.0.0/16}\n",
	}
	if gate {
		stages += `    - name: Gate
      readyWhen:
        - kind: ConfigMap
          cel: "has(object.metadata.annotations) && 'gate' in object.metadata.annotations && object.metadata.annotations['gate'] == 'open'"
          message: waiting for the gate to open
`
		resources = "resources: [namespace.yaml, config.yaml, gate.yaml]\n"
		files["apps/demo/gate.yaml"] = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gate\n  namespace: " + appNS + "\n  labels: {capstan.dev/stage: Gate}\ndata: {purpose: a stage the test finishes}\n"
	}
	files["apps/demo/kustomization.yaml"] = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" + resources
	files["clusters/demo.yaml"] = `apiVersion: capstan.dev/v1alpha1
kind: ClusterDeployment
metadata: {name: demo, namespace: ` + capstanNS + `}
spec:
  path: apps/demo
  interval: 2s
` + stages
	return files
}

func newClient(t testing.TB) client.Client {
	t.Helper()
	c, err := client.New(cl.Config(), client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitFor polls cond every 200 ms until it holds, failing the test with
// what it last saw at the deadline.
func waitFor(t testing.TB, what string, cond func() (bool, string, error)) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	last := ""
	for {
		ok, seen, err := cond()
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("wait for %s: %v", what, err)
		}
		if ok {
			return
		}
		if seen != "" {
			last = seen
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s; last seen: %s", what, waitTimeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// capstan runs the capstan binary against the cluster and returns what it
// printed.
func capstan(t testing.TB, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, append(args, "--kubeconfig", cl.KubeconfigPath())...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// gitURL is the root repository as pods reach it.
func gitURL() string {
	return strings.Replace(gitSrv.HTTPURL(repoName), "127.0.0.1", cl.HostAddress(), 1)
}

// installArgs are the flags every install in this suite uses.
func installArgs(t testing.TB) []string {
	t.Helper()
	args := []string{"install", "--image", imageRef,
		"--source", gitURL(), "--branch", "main", "--path", "clusters", "--source-username", gitUser,
		"--interval", "2s", "--timeout", "4m"}
	if cl.HostNetwork() {
		args = append(args, "--host-network",
			"--metrics-port", strconv.Itoa(ports.metrics), "--health-port", strconv.Itoa(ports.health))
	}
	if host, port, ok := cl.PodAPIServer(); ok {
		args = append(args, "--api-server", net.JoinHostPort(host, strconv.Itoa(port)))
	}
	return args
}

// ports are the node ports of the daemon's pod on a host-network node.
var ports struct{ metrics, health int }

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestCapstanInCluster installs Capstan with `capstan install`, watches
// it reconcile a repository as a pod under its own ServiceAccount, installs
// again, fails over to a standby, misses a permission, and uninstalls.
// The steps build on each other, so the first failure ends the test.
func TestCapstanInCluster(t *testing.T) {
	ports.metrics, ports.health = freePort(t), freePort(t)
	c := newClient(t)
	if _, err := gitSrv.CreateRepo(repoName); err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(repoName, "main", demoFiles(false), "demo cluster"); err != nil {
		t.Fatal(err)
	}
	// The git password reaches the daemon through the Secret the
	// Deployment reads its environment from.
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: capstanNS}},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "capstan-secrets", Namespace: capstanNS},
			StringData: map[string]string{"CAPSTAN_SOURCE_PASSWORD": gitPassword},
		},
	} {
		if err := c.Create(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		name string
		run  func(*testing.T, client.Client)
	}{
		{"install runs the daemon as a pod that takes the lease", testInstall},
		{"the daemon reconciles the root repository under its ServiceAccount", testReconciles},
		{"a second install changes nothing", testInstallAgain},
		{"another replica takes over a stage in progress without applying it again", testFailover},
		{"a permission RBAC lacks is named in status, and granting it heals", testMissingPermission},
		{"Capstan applies its own Deployment from git and hands over to the pod it rolled out", testManagesItself},
		{"a deployment acts as its ServiceAccount under the shipped RBAC", testActsAsItsServiceAccount},
		{"uninstall refuses while ClusterDeployments exist, then removes everything", testUninstall},
	} {
		if !t.Run(step.name, func(t *testing.T) { step.run(t, c) }) {
			t.FailNow()
		}
	}
}

func testInstall(t *testing.T, c client.Client) {
	out, err := capstan(t, installArgs(t)...)
	t.Logf("capstan install:\n%s", out)
	if err != nil {
		t.Fatalf("capstan install: %v", err)
	}
	if !strings.Contains(out, "Capstan is running; leader ") {
		t.Errorf("install did not report the leader:\n%s", out)
	}
	pod := daemonPod(t, c)
	if pod.Spec.NodeName == "" || pod.Status.Phase != corev1.PodRunning {
		t.Fatalf("pod %s: node %q, phase %s; want running on a node", pod.Name, pod.Spec.NodeName, pod.Status.Phase)
	}
	if !podReady(pod) {
		t.Errorf("pod %s is not Ready after install returned", pod.Name)
	}
	// No admin credentials in the pod: its one identity is the
	// ServiceAccount token the kubelet projects.
	if pod.Spec.ServiceAccountName != "capstan" {
		t.Errorf("pod runs as ServiceAccount %q, want capstan", pod.Spec.ServiceAccountName)
	}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil || v.Secret != nil {
			t.Errorf("pod mounts volume %s from the host or a Secret; want only the projected ServiceAccount token and /tmp", v.Name)
		}
	}
	sc := pod.Spec.Containers[0].SecurityContext
	if uid := pod.Spec.SecurityContext.RunAsUser; uid == nil || *uid != 65532 || sc == nil || !ptr.Deref(sc.ReadOnlyRootFilesystem, false) {
		t.Errorf("pod security: runAsUser %v, container %+v; want 65532 and a read-only root filesystem", uid, sc)
	}
	if pod.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the daemon restarted %d times", pod.Status.ContainerStatuses[0].RestartCount)
	}
	holder := leaseHolder(t, c)
	if holder == "" {
		t.Fatal("nobody holds the leader Lease after install")
	}
	t.Logf("pod %s on node %s, lease held by %s", pod.Name, pod.Spec.NodeName, holder)
}

func testReconciles(t *testing.T, c client.Client) {
	cd := waitReady(t, c)
	t.Logf("demo Ready at %s", cd.Status.Revision)
	var cm corev1.ConfigMap
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: appNS, Name: "settings"}, &cm); err != nil {
		t.Fatal(err)
	}
	managers := []string{}
	for _, mf := range cm.ManagedFields {
		managers = append(managers, mf.Manager+"/"+string(mf.Operation))
	}
	if !strings.Contains(strings.Join(managers, ","), "capstan/Apply") {
		t.Errorf("ConfigMap settings managed by %v, want capstan's server-side apply", managers)
	}
	// The daemon's log shows it reconciled: the pod really ran it.
	logs, err := cl.PodLogs(t.Context(), capstanNS, daemonPod(t, c).Name, "capstan")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs, "demo") {
		t.Errorf("the daemon's log does not mention the demo deployment:\n%s", tail(logs, 20))
	}
}

func testInstallAgain(t *testing.T, c client.Client) {
	before := daemonPod(t, c)
	out, err := capstan(t, installArgs(t)...)
	if err != nil {
		t.Fatalf("second capstan install: %v\n%s", err, out)
	}
	if !strings.Contains(out, " 0 created, 0 configured,") {
		t.Errorf("second install changed something:\n%s", out)
	}
	after := daemonPod(t, c)
	if after.UID != before.UID {
		t.Errorf("second install replaced the pod %s with %s", before.Name, after.Name)
	}
}

func testFailover(t *testing.T, c client.Client) {
	ctx := t.Context()
	standby := startStandby(t)
	waitFor(t, "the standby to run and wait for the lease", func() (bool, string, error) {
		return strings.Contains(strings.ToLower(standby.log.String()), "attempting to acquire leader lease"), tail(standby.log.String(), 3), nil
	})
	oldHolder := leaseHolder(t, c)

	// A stage in progress: Gate waits for the test.
	if _, err := gitSrv.Commit(repoName, "main", demoFiles(true), "a gate stage"); err != nil {
		t.Fatal(err)
	}
	var gate capstanv1.StageStatus
	waitFor(t, "stage Gate applied and waiting", func() (bool, string, error) {
		cd, err := get(ctx, c)
		if err != nil {
			return false, "", err
		}
		s := stage(cd, "Gate")
		gate = s
		return s.State == capstanv1.StageInProgress && s.AppliedAt != nil, fmt.Sprintf("%+v", s), nil
	})
	if got := standby.metric(t, "capstan_apply_objects_total"); got != 0 {
		t.Errorf("the standby applied %v objects while it did not lead", got)
	}

	pod := daemonPod(t, c)
	killed := time.Now()
	if err := c.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	var newHolder string
	waitFor(t, "another replica to take the lease", func() (bool, string, error) {
		newHolder = leaseHolder(t, c)
		return newHolder != "" && newHolder != oldHolder, newHolder, nil
	})
	t.Logf("lease passed from %s to %s %s after the leader's pod was deleted", oldHolder, newHolder, time.Since(killed).Round(100*time.Millisecond))

	begin := time.Now()
	annotate(t, c, "gate", "gate", "open")
	cd := waitReady(t, c)
	t.Logf("gate opened; Ready %s later", time.Since(begin).Round(100*time.Millisecond))
	after := stage(cd, "Gate")
	if !after.AppliedAt.Equal(gate.AppliedAt) {
		t.Errorf("stage Gate was applied again after the failover: appliedAt %s, then %s", gate.AppliedAt, after.AppliedAt)
	}
	t.Logf("stage Gate: applied %s, ready %s, %d attempts", after.AppliedAt, after.FinishedAt, after.Attempts)
	begin = time.Now()
	standby.stop(t)
	t.Logf("standby stopped in %s", time.Since(begin).Round(100*time.Millisecond))
	waitFor(t, "the Deployment's new pod to be Ready", func() (bool, string, error) {
		p := daemonPod(t, c)
		return p.UID != pod.UID && podReady(p), p.Name + " " + string(p.Status.Phase), nil
	})
}

// testMissingPermission takes configmaps out of the aggregated apply role,
// commits a revision with a new ConfigMap, and expects the stage to fail
// naming the verb, the resource and the ServiceAccount, and to retry; the
// rule put back, the same revision becomes Ready.
func testMissingPermission(t *testing.T, c client.Client) {
	ctx := t.Context()
	var role rbacv1.ClusterRole
	key := client.ObjectKey{Name: "capstan-apply-cluster-api"}
	if err := c.Get(ctx, key, &role); err != nil {
		t.Fatal(err)
	}
	original := role.DeepCopy()
	for i := range role.Rules {
		role.Rules[i].Resources = slices.DeleteFunc(role.Rules[i].Resources, func(r string) bool { return r == "configmaps" })
	}
	if err := c.Update(ctx, &role); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if restored {
			return
		}
		restored = true
		var cur rbacv1.ClusterRole
		if err := c.Get(ctx, key, &cur); err != nil {
			t.Fatal(err)
		}
		cur.Rules = original.Rules
		if err := c.Update(ctx, &cur); err != nil {
			t.Fatal(err)
		}
	}
	defer restore()

	files := demoFiles(true)
	files["apps/demo/config.yaml"] += "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\n  namespace: " + appNS + "\n  labels: {capstan.dev/stage: Config}\ndata: {added: by a commit}\n"
	commit, err := gitSrv.Commit(repoName, "main", files, "one more ConfigMap")
	if err != nil {
		t.Fatal(err)
	}
	const sa = "system:serviceaccount:" + capstanNS + ":capstan"
	var msg string
	waitFor(t, "stage Config to fail for want of a permission", func() (bool, string, error) {
		cd, err := get(ctx, c)
		if err != nil {
			return false, "", err
		}
		s := stage(cd, "Config")
		msg = s.Message
		return strings.Contains(cd.Status.Revision, commit[:8]) && s.State == capstanv1.StageFailed, fmt.Sprintf("%s: %s", s.State, s.Message), nil
	})
	for _, want := range []string{"forbidden", sa, `"configmaps"`, "ConfigMap/" + appNS + "/extra"} {
		if !strings.Contains(msg, want) {
			t.Errorf("stage Config says %q; want it to name %q", msg, want)
		}
	}
	if !strings.Contains(msg, "patch") && !strings.Contains(msg, "create") && !strings.Contains(msg, "get") {
		t.Errorf("stage Config says %q; want it to name the verb", msg)
	}
	t.Logf("without the permission: %s", msg)
	restore()
	cd := waitReady(t, c)
	if !strings.Contains(cd.Status.Revision, commit[:8]) {
		t.Errorf("Ready at %s, want the commit %s", cd.Status.Revision, commit)
	}
	if s := stage(cd, "Config"); s.Attempts < 2 {
		t.Errorf("stage Config Ready after %d attempts; it failed once at least", s.Attempts)
	}
}

func testUninstall(t *testing.T, c client.Client) {
	out, err := capstan(t, "uninstall", "--timeout", "3m")
	if err == nil || !strings.Contains(out, "Capstan still manages 1 ClusterDeployment ("+capstanNS+"/demo)") {
		t.Fatalf("uninstall with a ClusterDeployment left: err %v, output:\n%s", err, out)
	}
	if _, err := get(t.Context(), c); err != nil {
		t.Fatalf("the refused uninstall removed the ClusterDeployment: %v", err)
	}
	out, err = capstan(t, "uninstall", "--force", "--timeout", "3m")
	t.Logf("capstan uninstall --force:\n%s", out)
	if err != nil {
		t.Fatalf("capstan uninstall --force: %v", err)
	}
	objs, err := manifests.Objects(manifests.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		u := o.DeepCopy()
		err := c.Get(t.Context(), client.ObjectKeyFromObject(o), u)
		if !apierrors.IsNotFound(err) && !isNoMatch(err) {
			t.Errorf("%s %s still there after uninstall (err %v)", o.GetKind(), o.GetName(), err)
		}
	}
	var pods corev1.PodList
	if err := c.List(t.Context(), &pods, client.InNamespace(capstanNS)); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) > 0 {
		t.Errorf("%d pods left in %s", len(pods.Items), capstanNS)
	}
	// What the daemon applied stays.
	var cm corev1.ConfigMap
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: appNS, Name: "settings"}, &cm); err != nil {
		t.Errorf("uninstall removed what the daemon applied: %v", err)
	}
}

func isNoMatch(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no matches for kind")
}

func get(ctx context.Context, c client.Client) (*capstanv1.ClusterDeployment, error) {
	cd := &capstanv1.ClusterDeployment{}
	return cd, c.Get(ctx, client.ObjectKey{Namespace: capstanNS, Name: "demo"}, cd)
}

func stage(cd *capstanv1.ClusterDeployment, name string) capstanv1.StageStatus {
	for _, s := range cd.Status.Stages {
		if s.Name == name {
			return s
		}
	}
	return capstanv1.StageStatus{}
}

// waitReady waits until the demo deployment is Ready at the newest commit.
func waitReady(t testing.TB, c client.Client) *capstanv1.ClusterDeployment {
	t.Helper()
	var cd *capstanv1.ClusterDeployment
	waitFor(t, "ClusterDeployment demo Ready", func() (bool, string, error) {
		var err error
		if cd, err = get(t.Context(), c); err != nil {
			return false, "", err
		}
		for _, cond := range cd.Status.Conditions {
			if cond.Type == "Ready" {
				return cond.Status == metav1.ConditionTrue && cond.ObservedGeneration == cd.Generation, cond.Reason + ": " + cond.Message, nil
			}
		}
		return false, "no Ready condition", nil
	})
	return cd
}

// daemonPod returns the one pod of the Deployment that is not being deleted.
func daemonPod(t testing.TB, c client.Client) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, "one pod of Deployment capstan", func() (bool, string, error) {
		var pods corev1.PodList
		if err := c.List(t.Context(), &pods, client.InNamespace(capstanNS), client.MatchingLabels{"app.kubernetes.io/name": "capstan"}); err != nil {
			return false, "", err
		}
		var live []corev1.Pod
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				live = append(live, p)
			}
		}
		if len(live) != 1 {
			return false, fmt.Sprintf("%d pods", len(live)), nil
		}
		pod = &live[0]
		return true, "", nil
	})
	return pod
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func leaseHolder(t testing.TB, c client.Client) string {
	t.Helper()
	var l coordinationv1.Lease
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: capstanNS, Name: manifests.LeaseName}, &l); err != nil {
		if apierrors.IsNotFound(err) {
			return ""
		}
		t.Fatal(err)
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

func annotate(t testing.TB, c client.Client, name, key, value string) {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: name}}
	patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, key, value))
	if err := c.Patch(t.Context(), cm, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// saKubeconfig writes a kubeconfig that authenticates as the daemon's
// ServiceAccount with a token from the TokenRequest API: a second daemon
// outside the cluster with exactly the pod's permissions.
func saKubeconfig(t testing.TB) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cl.Config())
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(capstanNS).CreateToken(t.Context(), "capstan", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := cl.Config()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "sa"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// standby is a second daemon, a process on this machine, with the pod's
// identity and flags.
type standby struct {
	cmd         *exec.Cmd
	log         *syncBuffer
	metricsAddr string
	done        chan error
}

func startStandby(t testing.TB) *standby {
	t.Helper()
	s := &standby{log: &syncBuffer{}, metricsAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t))), done: make(chan error, 1)}
	s.cmd = exec.Command(binPath, "run", "--kubeconfig", saKubeconfig(t),
		"--source", gitURL(), "--branch", "main", "--path", "clusters", "--source-username", gitUser, "--interval", "2s",
		"--leader-elect", "--leader-election-namespace", capstanNS,
		"--metrics-addr", s.metricsAddr, "--health-addr", "0", "--log-format", "text")
	s.cmd.Env = append(os.Environ(), "CAPSTAN_SOURCE_PASSWORD="+gitPassword)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	t.Cleanup(func() { s.stop(t) })
	return s
}

func (s *standby) stop(t testing.TB) {
	if s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	if t.Failed() {
		t.Logf("standby log:\n%s", tail(s.log.String(), 40))
	}
}

// metric sums a counter's samples from the standby's /metrics.
func (s *standby) metric(t testing.TB, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + s.metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("read the standby's metrics: %v", err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("read the standby's metrics: %s %v", resp.Status, err)
	}
	sum := 0.0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// syncBuffer is a bytes.Buffer safe for a process writing and a test
// reading.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

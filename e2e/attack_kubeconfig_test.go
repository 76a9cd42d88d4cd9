package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/testca"
	"github.com/capstan-dev/capstan/reconciler"
)

// The attacks of issue 26 on what a deployment reaches through a
// kubeconfig Secret, and on what a pivot hands out (docs/kubeconfigs.md).
// Each attack is seen succeeding against the code before the fix: the
// waits below end as soon as the attack worked, so that the assertion
// after them says so.

// attackFiles is an overlay whose stage Remote plants ConfigMap planted in
// namespace ${TARGET}; extra holds more objects.
func attackFiles(extra string) map[string]string {
	return map[string]string{
		"clusters/attack/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [objects.yaml]\n",
		"clusters/attack/objects.yaml": `apiVersion: v1
kind: ConfigMap
metadata: {name: planted, namespace: '${TARGET}', labels: {capstan.dev/stage: Remote}}
data: {by: the attacker}
` + extra,
	}
}

// attackRepo is a repository of ns holding files.
func attackRepo(t testing.TB, ns string, files map[string]string) string {
	t.Helper()
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "the attack"); err != nil {
		t.Fatal(err)
	}
	return url
}

// attackSpec walks the overlay of url with ConfigMap planted in target.
func attackSpec(t testing.TB, c client.Client, url, ns, target string) capstanv1.ClusterDeploymentSpec {
	t.Helper()
	return capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, Ref: capstanv1.GitRef{Branch: "main"}, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(t, c, ns)},
		}},
		Path:       "clusters/attack",
		Substitute: map[string]string{"TARGET": target},
		Interval:   &metav1.Duration{Duration: 500 * time.Millisecond},
		Stages:     []capstanv1.StageSpec{{Name: "Remote"}},
	}
}

// kubeconfigOf is a kubeconfig of one context: server, trusting caPEM,
// as user (cluster "home", user "attacker").
func kubeconfigOf(t testing.TB, server string, caPEM []byte, user clientcmdapi.AuthInfo) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["home"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["attacker"] = &user
	cfg.Contexts["attack"] = &clientcmdapi.Context{Cluster: "home", AuthInfo: "attacker"}
	cfg.CurrentContext = "attack"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// stalledSaying reports whether cd is Stalled with a message holding
// every one of words.
func stalledSaying(cd *capstanv1.ClusterDeployment, words ...string) bool {
	st := condition(cd, capstanv1.ConditionStalled)
	if st == nil || st.Status != metav1.ConditionTrue {
		return false
	}
	for _, w := range words {
		if !strings.Contains(st.Message, w) {
			return false
		}
	}
	return true
}

func fileExists(t testing.TB, path string) bool {
	t.Helper()
	_, err := os.Stat(path)
	return err == nil
}

// TestAttackKubeconfigExecPlugin: a tenant's kubeconfig Secret whose user
// is an exec plugin (a shell command that touches a marker file) never
// runs it: the deployment stalls naming the field, the user and the
// Secret. With capstan run --insecure-kubeconfig-exec it runs, which
// shows that the marker would tell.
func TestAttackKubeconfigExecPlugin(t *testing.T) {
	execKubeconfig := func(t *testing.T, marker string) []byte {
		credential := `{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"` + env.Config.BearerToken + `"}}`
		return kubeconfigOf(t, env.Config.Host, env.Config.CAData, clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{
			Command: "/bin/sh", Args: []string{"-c", "touch " + marker + " && echo '" + credential + "'"},
			APIVersion: "client.authentication.k8s.io/v1", InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
		}})
	}
	deploy := func(t *testing.T, c client.Client, ns, marker string) {
		writeKubeconfigSecret(t, c, ns, "exec-kubeconfig", execKubeconfig(t, marker))
		spec := attackSpec(t, c, attackRepo(t, ns, attackFiles("")), ns, ns)
		spec.KubeConfig = kubeconfigRef("exec-kubeconfig")
		createDeployment(t, c, ns, "exec", spec)
	}

	t.Run("refused: the command never runs", func(t *testing.T) {
		c := newClient(t)
		ns := newNamespace(t)
		marker := filepath.Join(t.TempDir(), "marker")
		startDaemon(t, nil)
		deploy(t, c, ns, marker)
		var cd *capstanv1.ClusterDeployment
		waitFor(t, "the deployment stalled naming exec (or the plugin run)", func() (bool, error) {
			if fileExists(t, marker) {
				return true, nil
			}
			cd = getDeployment(t, c, ns, "exec")
			return stalledSaying(cd, "exec"), fmt.Errorf("status: %s", describe(cd))
		})
		if fileExists(t, marker) {
			t.Fatalf("the exec plugin of kubeconfig Secret %s/exec-kubeconfig ran inside Capstan's process: %s was created", ns, marker)
		}
		msg := condition(cd, capstanv1.ConditionStalled).Message
		for _, want := range []string{"Secret " + ns + "/exec-kubeconfig key value", `user "attacker": field exec is refused`, "--insecure-kubeconfig-exec"} {
			if !strings.Contains(msg, want) {
				t.Errorf("Stalled says %q; want it to say %q", msg, want)
			}
		}
		if r := condition(cd, capstanv1.ConditionStalled).Reason; r != "KubeconfigRefused" {
			t.Errorf("Stalled reason %s, want KubeconfigRefused", r)
		}
		if strings.Contains(msg, marker) || strings.Contains(msg, env.Config.BearerToken) {
			t.Errorf("Stalled quotes the kubeconfig: %q", msg)
		}
		if object(t, c, configMapGVK, ns, "planted") != nil {
			t.Error("the stage applied through the refused kubeconfig")
		}
		if fileExists(t, marker) {
			t.Fatalf("the exec plugin ran after the deployment stalled: %s was created", marker)
		}
	})

	t.Run("allowed by --insecure-kubeconfig-exec: the command runs", func(t *testing.T) {
		c := newClient(t)
		ns := newNamespace(t)
		marker := filepath.Join(t.TempDir(), "marker")
		startDaemonWith(t, nil, allowKubeconfigExec)
		deploy(t, c, ns, marker)
		waitFor(t, "the exec plugin to run", func() (bool, error) {
			return fileExists(t, marker), fmt.Errorf("status: %s", describe(getDeployment(t, c, ns, "exec")))
		})
	})
}

// countingProxy serves the home API server over https behind a CA of its
// own and counts the requests that reach it: what a kubeconfig naming it
// makes the daemon send.
type countingProxy struct {
	*httptest.Server
	ca *testca.CA

	mu       sync.Mutex
	requests []string
}

func newCountingProxy(t *testing.T) *countingProxy {
	t.Helper()
	upstream, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	// Forwards the client's Authorization header as it came.
	transport, err := rest.TransportFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData}})
	if err != nil {
		t.Fatal(err)
	}
	forward := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(upstream) }, Transport: transport}
	p := &countingProxy{ca: testca.Must(t, "home-proxy")}
	p.Server, err = p.ca.Serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.requests = append(p.requests, r.Method+" "+r.URL.Path)
		p.mu.Unlock()
		forward.ServeHTTP(w, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// seen returns the requests that reached the server, and how many wrote.
func (p *countingProxy) seen() ([]string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	writes := 0
	for _, r := range p.requests {
		if !strings.HasPrefix(r, http.MethodGet+" ") {
			writes++
		}
	}
	return append([]string(nil), p.requests...), writes
}

// TestAttackKubeconfigToCapstansOwnCluster: a deployment acting as a
// narrow ServiceAccount (ConfigMaps of its own namespace only) points
// its kubeconfig at the API server Capstan runs against, to plant a
// ConfigMap in a namespace its ServiceAccount may not write: with
// tokenFile naming the daemon's own token, and with an inline token of
// the same cluster. Both stall; nothing is planted; the tokenFile one
// sends no request at all through the kubeconfig.
func TestAttackKubeconfigToCapstansOwnCluster(t *testing.T) {
	attack := func(t *testing.T, user func(t *testing.T) clientcmdapi.AuthInfo, says string) (*countingProxy, *capstanv1.ClusterDeployment, string) {
		c := newClient(t)
		ns, other := newNamespace(t), newNamespace(t)
		grantConfigMaps(t, c, ns, "deployer", ns)
		proxy := newCountingProxy(t)
		writeKubeconfigSecret(t, c, ns, "home-kubeconfig", kubeconfigOf(t, proxy.URL, proxy.ca.PEM, user(t)))
		startDaemon(t, nil)
		spec := attackSpec(t, c, attackRepo(t, ns, attackFiles("")), ns, other)
		spec.ServiceAccountName = "deployer"
		spec.KubeConfig = kubeconfigRef("home-kubeconfig")
		createDeployment(t, c, ns, "escape", spec)
		var cd *capstanv1.ClusterDeployment
		waitFor(t, "the deployment stalled (or the ConfigMap planted)", func() (bool, error) {
			if object(t, c, configMapGVK, other, "planted") != nil {
				return true, nil
			}
			cd = getDeployment(t, c, ns, "escape")
			return stalledSaying(cd, says), fmt.Errorf("status: %s", describe(cd))
		})
		if object(t, c, configMapGVK, other, "planted") != nil {
			t.Fatalf("ServiceAccount %s/deployer, which may not write namespace %s, planted ConfigMap %s/planted through kubeconfig Secret %s/home-kubeconfig",
				ns, other, other, ns)
		}
		return proxy, cd, ns
	}

	t.Run("tokenFile naming Capstan's own token", func(t *testing.T) {
		proxy, cd, ns := attack(t, func(t *testing.T) clientcmdapi.AuthInfo {
			token := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(token, []byte(env.Config.BearerToken), 0o600); err != nil {
				t.Fatal(err)
			}
			return clientcmdapi.AuthInfo{TokenFile: token}
		}, "tokenFile")
		if requests, _ := proxy.seen(); len(requests) > 0 {
			t.Errorf("%d requests reached the API server through the refused kubeconfig: %v", len(requests), requests)
		}
		msg := condition(cd, capstanv1.ConditionStalled).Message
		for _, want := range []string{"Secret " + ns + "/home-kubeconfig", `user "attacker": field tokenFile is refused`} {
			if !strings.Contains(msg, want) {
				t.Errorf("Stalled says %q; want it to say %q", msg, want)
			}
		}
	})

	t.Run("an inline token of the same cluster", func(t *testing.T) {
		proxy, cd, ns := attack(t, func(*testing.T) clientcmdapi.AuthInfo {
			return clientcmdapi.AuthInfo{Token: env.Config.BearerToken}
		}, "reaches the cluster Capstan runs in")
		if requests, writes := proxy.seen(); writes > 0 {
			t.Errorf("%d writes reached the API server through the refused kubeconfig: %v", writes, requests)
		}
		msg := condition(cd, capstanv1.ConditionStalled).Message
		for _, want := range []string{"Secret " + ns + "/home-kubeconfig", "ServiceAccount " + ns + "/deployer"} {
			if !strings.Contains(msg, want) {
				t.Errorf("Stalled says %q; want it to say %q", msg, want)
			}
		}
		if strings.Contains(msg, env.Config.BearerToken) {
			t.Error("Stalled quotes the token")
		}
	})
}

// TestAttackKubeconfigOfAnotherNamespace: a tenant's deployment renders a
// Cluster API Cluster in the victim's namespace and names it in
// kubeConfig.cluster, to act through the victim's prod-kubeconfig; or
// tampers with its status.inventory to have its deletion go through it.
// The daemon never reads the victim's Secret.
func TestAttackKubeconfigOfAnotherNamespace(t *testing.T) {
	admin, err := os.ReadFile(env.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	reads := func(counter *requestCounter, ns string) int {
		return counter.listsOf("/namespaces/" + ns + "/secrets/prod-kubeconfig")
	}

	t.Run("a rendered Cluster in another namespace", func(t *testing.T) {
		c := newClient(t)
		home, ns, victim := newNamespace(t), newNamespace(t), newNamespace(t)
		writeKubeconfigSecret(t, c, victim, "prod-kubeconfig", admin)
		cluster := "---\napiVersion: cluster.x-k8s.io/v1beta2\nkind: Cluster\nmetadata: {name: prod, namespace: " + victim +
			", labels: {capstan.dev/stage: Cluster}}\nspec: {clusterNetwork: {pods: {cidrBlocks: [10.0.0.0/16]}}}\n"
		spec := attackSpec(t, c, attackRepo(t, ns, attackFiles(cluster)), ns, ns)
		spec.Stages = []capstanv1.StageSpec{
			{Name: "Remote", KubeConfig: &capstanv1.KubeConfigReference{Cluster: &capstanv1.ClusterKubeConfigReference{Name: "prod"}}},
			{Name: "Cluster"},
		}
		// Capstan's own namespace is home: the tenant's is not the platform's.
		_, counter := startDaemonWith(t, nil, func(o *reconciler.Options) { o.LeaderElection.Namespace = home })
		createDeployment(t, c, ns, "crossing", spec)
		var cd *capstanv1.ClusterDeployment
		waitFor(t, "the deployment stalled naming "+victim+" (or the victim's Secret read)", func() (bool, error) {
			if reads(counter, victim) > 0 {
				return true, nil
			}
			cd = getDeployment(t, c, ns, "crossing")
			return stalledSaying(cd, victim), fmt.Errorf("status: %s", describe(cd))
		})
		if n := reads(counter, victim); n > 0 {
			t.Fatalf("the daemon read Secret %s/prod-kubeconfig %d times for a deployment of namespace %s", victim, n, ns)
		}
		msg := condition(cd, capstanv1.ConditionStalled).Message
		for _, want := range []string{"kubeConfig.cluster", "namespace " + victim, "not the deployment's (" + ns + ")"} {
			if !strings.Contains(msg, want) {
				t.Errorf("Stalled says %q; want it to say %q", msg, want)
			}
		}
		if object(t, c, configMapGVK, ns, "planted") != nil {
			t.Error("stage Remote applied through the victim's kubeconfig")
		}
	})

	t.Run("a deletion through a kubeconfig its status names", func(t *testing.T) {
		c := newClient(t)
		home, ns, victim := newNamespace(t), newNamespace(t), newNamespace(t)
		writeKubeconfigSecret(t, c, victim, "prod-kubeconfig", admin)
		writeKubeconfigSecret(t, c, ns, "mine-kubeconfig", admin)
		spec := attackSpec(t, c, attackRepo(t, ns, attackFiles("")), ns, ns)
		spec.KubeConfig = kubeconfigRef("mine-kubeconfig")
		_, counter := startDaemonWith(t, nil, func(o *reconciler.Options) { o.LeaderElection.Namespace = home })
		createDeployment(t, c, ns, "tampered", spec)
		cd := waitDeployment(t, c, ns, "tampered", "Ready", isReady)

		// Whoever may patch the status subresource points the record of
		// stage Remote at the victim's Secret, then deletes the deployment.
		if cd.Status.Inventory == nil || len(cd.Status.Inventory.Stages) != 1 || cd.Status.Inventory.Stages[0].KubeConfig == nil {
			t.Fatalf("status.inventory %+v; want stage Remote applied through mine-kubeconfig", cd.Status.Inventory)
		}
		cd.Status.Inventory.Stages[0].KubeConfig.Name = "prod-kubeconfig"
		cd.Status.Inventory.Stages[0].KubeConfigNamespace = victim
		if err := c.Status().Update(context.Background(), cd); err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(context.Background(), cd); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the deployment gone (or the victim's Secret read)", func() (bool, error) {
			err := c.Get(context.Background(), client.ObjectKeyFromObject(cd), &capstanv1.ClusterDeployment{})
			return apierrors.IsNotFound(err) || reads(counter, victim) > 0, err
		})
		if n := reads(counter, victim); n > 0 {
			t.Fatalf("deleting a deployment of %s, the daemon read Secret %s/prod-kubeconfig %d times, as its status named", ns, victim, n)
		}
		if object(t, c, configMapGVK, ns, "planted") == nil {
			t.Error("ConfigMap planted was deleted through a kubeconfig the status named")
		}
		waitFor(t, "an event saying why stage Remote's objects were left", func() (bool, error) {
			events := &eventsv1.EventList{}
			if err := c.List(context.Background(), events, client.InNamespace(ns)); err != nil {
				return false, err
			}
			for _, e := range events.Items {
				if e.Reason == "Orphaned" && strings.Contains(e.Note, "status.inventory stage Remote") && strings.Contains(e.Note, victim) {
					return true, nil
				}
			}
			return false, nil
		})
	})
}

// allowKubeconfigExec is capstan run --insecure-kubeconfig-exec.
func allowKubeconfigExec(o *reconciler.Options) { o.Kubeconfigs.AllowExec = true }

// TestAttackPivotFromATenantNamespace: the Capstan a pivot installs gets
// the root source's credentials only for a root deployment of Capstan's
// own namespace. A tenant's deployment pivots into a cluster the tenant
// holds: the target gets no Secret capstan-secrets, no root source, and
// the pivot says what it did not copy. Then a root deployment of
// Capstan's namespace pivots into the same target, and gets them (which
// shows the checks would see a copy). The daemon is the capstan binary,
// run as `capstan run` with the root password in its environment.
func TestAttackPivotFromATenantNamespace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := capstanBinary(t)
	p := newPivotSetup(ctx, t, true)
	c, tc := p.c, p.tc
	home := newNamespace(t)
	rootURL, err := gitSrv.CreateRepo(home)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(home, gitserver.DefaultBranch, map[string]string{"clusters/README.md": "root deployments go here\n"}, "an empty root"); err != nil {
		t.Fatal(err)
	}
	startCapstanRun(t, bin, "--source", rootURL, "--branch", "main", "--path", "clusters", "--interval", "1s",
		"--source-username", "capstan", "--namespace", home, "--leader-elect=false", "--leader-election-namespace", home,
		"--image", "capstan:attack")

	p.createMovable(t)
	cd := waitDeployment(t, c, p.ns, "movable", "the tenant's move done and Capstan installed in the target", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Pivot != nil && cd.Status.Pivot.Phase.Reached(capstanv1.PivotInstalled)
	})
	if leaked := rootCredentialsIn(t, tc); leaked != "" {
		t.Fatalf("the pivot of tenant deployment %s/movable handed the root source's credentials to its target: %s", p.ns, leaked)
	}
	for _, want := range []string{"were not copied", "deployment " + p.ns + "/movable has a source of its own", "capstan-secrets"} {
		if !strings.Contains(cd.Status.Pivot.Message, want) {
			t.Errorf("status.pivot.message %q does not say %q", cd.Status.Pivot.Message, want)
		}
	}

	// A root deployment of Capstan's namespace, into the same target.
	kubeconfig, err := os.ReadFile(p.tenv.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	writeKubeconfigSecret(t, c, home, "target-kubeconfig", kubeconfig)
	if _, err := gitSrv.Commit(home, gitserver.DefaultBranch, map[string]string{
		"clusters/platform.yaml": `apiVersion: capstan.dev/v1alpha1
kind: ClusterDeployment
metadata: {name: platform, namespace: ` + home + `}
spec:
  path: platform
  interval: 1s
  stages:
    - {name: Config}
    - {name: Pivot, action: pivot, kubeConfig: {secretRef: {name: target-kubeconfig}}}
`,
		"platform/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [config.yaml]\n",
		"platform/config.yaml":        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: platform-settings, namespace: " + home + ", labels: {capstan.dev/stage: Config}}\ndata: {a: b}\n",
	}, "a root deployment that moves"); err != nil {
		t.Fatal(err)
	}
	root := waitDeployment(t, c, home, "platform", "the root deployment's move done", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Pivot != nil && cd.Status.Pivot.Phase.Reached(capstanv1.PivotInstalled)
	})
	if strings.Contains(root.Status.Pivot.Message, "not copied") {
		t.Errorf("the root deployment's pivot says %q", root.Status.Pivot.Message)
	}
	if got := rootCredentialsIn(t, tc); !strings.Contains(got, "CAPSTAN_SOURCE_PASSWORD") || !strings.Contains(got, "CAPSTAN_SOURCE=") {
		t.Errorf("the root deployment's target has %q; want the root source and its password", got)
	}
}

// rootCredentialsIn says what of the root source a target holds in
// Capstan's namespace there: "" for nothing.
func rootCredentialsIn(t testing.TB, c client.Client) string {
	t.Helper()
	var found []string
	secret := &corev1.Secret{}
	err := c.Get(context.Background(), client.ObjectKey{Namespace: "capstan-system", Name: "capstan-secrets"}, secret)
	switch {
	case err == nil:
		for k, v := range secret.Data {
			if len(v) > 0 {
				found = append(found, "Secret capstan-system/capstan-secrets key "+k)
			}
		}
	case !apierrors.IsNotFound(err):
		t.Fatal(err)
	}
	cms := &corev1.ConfigMapList{}
	if err := c.List(context.Background(), cms, client.InNamespace("capstan-system")); err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		if v := cm.Data["CAPSTAN_SOURCE"]; v != "" {
			found = append(found, "ConfigMap capstan-system/"+cm.Name+" CAPSTAN_SOURCE="+v)
		}
	}
	return strings.Join(found, "; ")
}

// startCapstanRun runs `capstan run args...` against the test control
// plane, with the git server's password as the root source's, until the
// test ends; its log is kept in the test's temporary directory and
// printed when the test fails.
func startCapstanRun(t *testing.T, bin string, args ...string) {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "capstan.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args = append([]string{"run", "--kubeconfig", env.KubeconfigPath, "--metrics-addr", "0", "--health-addr", "0", "--log-format", "text"}, args...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "CAPSTAN_SOURCE_PASSWORD=s3cret-token")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = log.Close()
		if t.Failed() {
			if out, err := os.ReadFile(logPath); err == nil {
				t.Logf("capstan run:\n%s", tail(string(out), 4000))
			}
		}
	})
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

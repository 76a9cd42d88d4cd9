package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/stages"
)

// daemonRoot holds the trees of the tests where diff must do as the
// daemon: keyed (a plan that needs the bootstrap key) and tenant (a
// deployment that acts as its ServiceAccount).
const daemonRoot = "testdata/diffdaemon"

// diffResult is what one run of capstan diff gave: its exit code and
// everything it printed, the error included.
type diffResult struct {
	code int
	out  string
}

func runDiff(t *testing.T, args ...string) diffResult {
	t.Helper()
	out, err := runCLI(t, append([]string{"diff", "--root", daemonRoot}, args...)...)
	var exit *exitError
	if errors.As(err, &exit) && exit.err != nil {
		out += exit.err.Error() + "\n"
	}
	return diffResult{code: exitCode(err), out: out}
}

func (r diffResult) want(t *testing.T, code int, lines ...string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d; output:\n%s", r.code, code, r.out)
	}
	for _, l := range lines {
		if !strings.Contains(r.out, l) {
			t.Errorf("output lacks %q:\n%s", l, r.out)
		}
	}
}

func (r diffResult) wantNot(t *testing.T, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if strings.Contains(r.out, l) {
			t.Errorf("output holds %q:\n%s", l, r.out)
		}
	}
}

func TestDiffAsTheDaemon(t *testing.T) {
	env, ctx := startControlPlane(t)
	c := mustWatch(t, env)
	admin := env.KubeconfigPath

	t.Run("bootstrap key", func(t *testing.T) {
		withSecret, noSecret, malformed := "keys-found", "keys-missing", "keys-malformed"
		for _, ns := range []string{withSecret, noSecret, malformed} {
			createNamespace(ctx, t, c, ns)
			createKeyedDeployment(ctx, t, c, ns)
		}
		pub, err := stages.NewExecutor(c).EnsureBootstrapKey(ctx, withSecret)
		if err != nil {
			t.Fatal(err)
		}
		applyKeyed(ctx, t, c, withSecret, pub)
		private := privateKeyLines(ctx, t, c, withSecret)
		if err := c.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: stages.BootstrapKeySecret, Namespace: malformed},
			Data:       map[string][]byte{"ssh-publickey": []byte("not a key"), corev1.SSHAuthPrivateKey: []byte("planted-private-half-3e9d")},
		}); err != nil {
			t.Fatal(err)
		}
		private = append(private, "planted-private-half-3e9d")

		for _, tc := range []struct {
			name  string
			args  []string
			code  int
			lines []string
			not   []string
		}{
			{
				name:  "objects applied with the daemon's key are unchanged: the key is read from its Secret",
				args:  []string{"--kubeconfig", admin, "--deployment", withSecret + "/keyed"},
				code:  diffExitNone,
				lines: []string{"no changes", "= ConfigMap " + withSecret + "/ssh"},
				not:   []string{placeholderComment, "does not exist yet"},
			},
			{
				name:  "-f reads the key of the file's namespace alike",
				args:  []string{"--kubeconfig", admin, "-f", writeKeyedFile(t, withSecret), "--substitute", "TARGET_NS=" + withSecret},
				code:  diffExitNone,
				lines: []string{"no changes"},
			},
			{
				name:  "--substitute gives another key: then it is the one compared",
				args:  []string{"--kubeconfig", admin, "--deployment", withSecret + "/keyed", "--substitute", stages.BootstrapKeyVar + "=ssh-ed25519 AAAA other"},
				code:  diffExitChanges,
				lines: []string{"~ ConfigMap " + withSecret + "/ssh", "data.authorized_keys"},
			},
			{
				name: "without the Secret a placeholder stands in, and the output says the daemon creates the key",
				args: []string{"--kubeconfig", admin, "--deployment", noSecret + "/keyed"},
				code: diffExitChanges,
				lines: []string{"bootstrap SSH key: Secret " + noSecret + "/capstan-bootstrap-key does not exist yet, the daemon creates it on its first reconcile",
					"+ ConfigMap " + noSecret + "/ssh"},
			},
			{
				name:  "a Secret without a public key is an error naming the Secret and its field",
				args:  []string{"--kubeconfig", admin, "--deployment", malformed + "/keyed"},
				code:  diffExitError,
				lines: []string{"bootstrap key Secret " + malformed + "/capstan-bootstrap-key: data.ssh-publickey is not an SSH public key"},
			},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := runDiff(t, tc.args...)
				r.want(t, tc.code, tc.lines...)
				r.wantNot(t, tc.not...)
				r.wantNot(t, private...)
			})
		}

		t.Run("-o json says where the key came from", func(t *testing.T) {
			for ns, from := range map[string]string{withSecret: keyFromSecret, noSecret: keyFromPlaceholder} {
				r := runDiff(t, "--kubeconfig", admin, "--deployment", ns+"/keyed", "-o", "json")
				r.wantNot(t, private...)
				var report diffReport
				if err := json.Unmarshal([]byte(r.out), &report); err != nil {
					t.Fatalf("%v:\n%s", err, r.out)
				}
				if report.BootstrapKey == nil || report.BootstrapKey.From != from || report.BootstrapKey.Secret != ns+"/"+stages.BootstrapKeySecret {
					t.Errorf("%s: bootstrapKey %+v, want from %s", ns, report.BootstrapKey, from)
				}
				if from == keyFromPlaceholder && !strings.Contains(report.BootstrapKey.Note, "the daemon creates it") {
					t.Errorf("%s: note %q does not say the daemon creates the key", ns, report.BootstrapKey.Note)
				}
			}
		})

		t.Run("the diff only reads: no key Secret is made", func(t *testing.T) {
			err := c.Get(ctx, client.ObjectKey{Namespace: noSecret, Name: stages.BootstrapKeySecret}, &corev1.Secret{})
			if !apierrors.IsNotFound(err) {
				t.Errorf("Secret %s/%s: %v, want not found", noSecret, stages.BootstrapKeySecret, err)
			}
		})
	})

	t.Run("ServiceAccount", func(t *testing.T) {
		createNamespace(ctx, t, c, "team")
		cd, err := readDeploymentFile(daemonRoot + "/tenant.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Create(ctx, cd); err != nil {
			t.Fatal(err)
		}
		grant(ctx, t, c, "team", "deployer", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"},
			Verbs: []string{"get", "list", "watch", "create", "patch", "delete"}})
		grant(ctx, t, c, "team", "wide", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps", "serviceaccounts"},
			Verbs: []string{"get", "list", "watch", "create", "patch", "delete"}})
		// viewer may read the deployment, and impersonate nobody.
		grant(ctx, t, c, "team", "viewer", rbacv1.PolicyRule{APIGroups: []string{capstanv1.GroupVersion.Group}, Resources: []string{"clusterdeployments"},
			Verbs: []string{"get", "list", "watch"}})
		viewer := serviceAccountKubeconfig(ctx, t, env, "team", "viewer")

		const refused = `User "system:serviceaccount:team:deployer" cannot patch resource "serviceaccounts"`
		for _, tc := range []struct {
			name  string
			args  []string
			code  int
			lines []string
			not   []string
		}{
			{
				name: "the deployment's ServiceAccount is impersonated: what it may not create is refused, naming it",
				args: []string{"--kubeconfig", admin, "--deployment", "team/app"},
				code: diffExitChanges,
				lines: []string{"against https://", "as ServiceAccount team/deployer", "+ ConfigMap team/app-config",
					"! ServiceAccount team/extra: failed", refused, "the deployment acts as ServiceAccount team/deployer"},
			},
			{
				name:  "-f names the ServiceAccount alike",
				args:  []string{"--kubeconfig", admin, "-f", daemonRoot + "/tenant.yaml"},
				code:  diffExitChanges,
				lines: []string{"as ServiceAccount team/deployer", "! ServiceAccount team/extra: failed", refused},
			},
			{
				name:  "--as-caller compares as the kubeconfig's user (an admin): both are creates",
				args:  []string{"--kubeconfig", admin, "--deployment", "team/app", "--as-caller"},
				code:  diffExitChanges,
				lines: []string{"2 to create, 0 to change, 0 to delete, 0 unchanged\n", "+ ServiceAccount team/extra"},
				not:   []string{"as ServiceAccount", "!"},
			},
			{
				name:  "--service-account names another one, over the spec's",
				args:  []string{"--kubeconfig", admin, "--deployment", "team/app", "--service-account", "wide"},
				code:  diffExitChanges,
				lines: []string{"as ServiceAccount team/wide", "2 to create, 0 to change, 0 to delete, 0 unchanged\n"},
				not:   []string{"!"},
			},
			{
				name: "a caller that may not impersonate is told whom, what to grant, and --as-caller",
				args: []string{"--kubeconfig", viewer, "--deployment", "team/app"},
				code: diffExitError,
				lines: []string{"act as ServiceAccount team/deployer (user system:serviceaccount:team:deployer)",
					`User "system:serviceaccount:team:viewer" cannot impersonate resource "serviceaccounts"`,
					"the caller needs the RBAC verb impersonate on resource serviceaccounts (core API group) named deployer in namespace team",
					"--as-caller"},
				not: []string{"+ ConfigMap"},
			},
			{
				name:  "--as-caller and --service-account exclude each other",
				args:  []string{"--kubeconfig", admin, "--deployment", "team/app", "--as-caller", "--service-account", "wide"},
				code:  diffExitError,
				lines: []string{"--as-caller and --service-account exclude each other"},
			},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := runDiff(t, tc.args...)
				r.want(t, tc.code, tc.lines...)
				r.wantNot(t, tc.not...)
			})
		}

		t.Run("-o json names the ServiceAccount compared as", func(t *testing.T) {
			r := runDiff(t, "--kubeconfig", admin, "--deployment", "team/app", "-o", "json")
			var report diffReport
			if err := json.Unmarshal([]byte(r.out), &report); err != nil {
				t.Fatalf("%v:\n%s", err, r.out)
			}
			if report.ServiceAccount != "team/deployer" || report.Diff.Counts().Problems != 1 {
				t.Errorf("serviceAccount %q, counts %+v; want team/deployer and 1 problem", report.ServiceAccount, report.Diff.Counts())
			}
		})
	})
}

func mustWatch(t *testing.T, env *testenv.Env) client.WithWatch {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func createNamespace(ctx context.Context, t *testing.T, c client.Client, ns string) {
	t.Helper()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
}

// keyedDeployment is testdata's keyed deployment in namespace ns, its
// ConfigMap there too.
func keyedDeployment(t *testing.T, ns string) *capstanv1.ClusterDeployment {
	t.Helper()
	cd, err := readDeploymentFile(daemonRoot + "/keyed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cd.Namespace = ns
	cd.Spec.Substitute = map[string]string{"TARGET_NS": ns}
	return cd
}

func createKeyedDeployment(ctx context.Context, t *testing.T, c client.Client, ns string) {
	t.Helper()
	if err := c.Create(ctx, keyedDeployment(t, ns)); err != nil {
		t.Fatal(err)
	}
}

// writeKeyedFile writes the keyed deployment of namespace ns to a file.
func writeKeyedFile(t *testing.T, ns string) string {
	t.Helper()
	data, err := os.ReadFile(daemonRoot + "/keyed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "keyed.yaml")
	data = []byte(strings.Replace(string(data), "  name: keyed\n", "  name: keyed\n  namespace: "+ns+"\n", 1))
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// applyKeyed applies the keyed deployment of ns with key as the daemon
// does: rendered with the key, stage by stage, with the owner labels.
func applyKeyed(ctx context.Context, t *testing.T, c client.WithWatch, ns, key string) {
	t.Helper()
	cd := keyedDeployment(t, ns)
	opts := render.DefaultOptions()
	opts.Substitute = map[string]string{stages.BootstrapKeyVar: key}
	plan, err := reconciler.PlanTree(ctx, reconciler.PlanInput{FS: os.DirFS(daemonRoot), Spec: cd.Spec, Render: opts})
	if err != nil {
		t.Fatal(err)
	}
	e := stages.NewExecutor(c)
	for i := range plan.Stages {
		if res := e.ApplyStage(ctx, &plan.Stages[i], stages.Owner{Name: cd.Name, Namespace: ns}); res.State == capstanv1.StageFailed {
			t.Fatal(res.Err)
		}
	}
}

// privateKeyLines are the lines of the private half of ns's bootstrap
// key: no output may hold any of them.
func privateKeyLines(ctx context.Context, t *testing.T, c client.Client, ns string) []string {
	t.Helper()
	s := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: stages.BootstrapKeySecret}, s); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(s.Data[corev1.SSHAuthPrivateKey]), "\n") {
		if len(l) > 20 && !strings.HasPrefix(l, "-----") {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		t.Fatal("the bootstrap key has no private half to look for")
	}
	return lines
}

// grant makes ServiceAccount ns/name, bound to a Role of rule.
func grant(ctx context.Context, t *testing.T, c client.Client, ns, name string, rule rbacv1.PolicyRule) {
	t.Helper()
	for _, obj := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Rules: []rbacv1.PolicyRule{rule}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}},
	} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
}

// serviceAccountKubeconfig writes a kubeconfig that authenticates as
// ServiceAccount ns/name, with a token from the TokenRequest API.
func serviceAccountKubeconfig(ctx context.Context, t *testing.T, env *testenv.Env, ns, name string) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: env.Config.Host, CertificateAuthorityData: env.Config.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: name}
	cfg.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

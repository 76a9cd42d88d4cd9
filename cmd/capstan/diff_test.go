package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/sopstest"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/stages"
)

// diffRoot holds the revisions the diff tests compare: v1 (applied), v2
// (every kind of change), invalid, broken (does not render).
const diffRoot = "testdata/diff"

// plantedDiffSecrets are the Secret values of testdata/diff; no output of
// diff may hold them.
var plantedDiffSecrets = []string{"planted-diff-secret-v1-93b1", "planted-diff-secret-v2-5c0e", "planted-diff-secret-hook-77aa"}

// startShopCluster starts a control plane with Capstan's CRDs, and
// applies revision v1 of testdata/diff as ClusterDeployment
// capstan-system/shop would: stage by stage, owner labels, inventory and
// revision in its status.
func startShopCluster(t *testing.T) *testenv.Env {
	t.Helper()
	env, ctx := startControlPlane(t)
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "capstan-system"}}); err != nil {
		t.Fatal(err)
	}
	cd, err := readDeploymentFile(diffRoot + "/clusterdeployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, cd); err != nil {
		t.Fatal(err)
	}
	opts := render.DefaultOptions()
	opts.Path = "v1"
	objs, err := render.Build(ctx, os.DirFS(diffRoot), opts)
	if err != nil {
		t.Fatal(err)
	}
	specs, err := stages.StageSpecs(cd.Spec)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := stages.BuildPlan(specs, objs)
	if err != nil {
		t.Fatal(err)
	}
	e := stages.NewExecutor(c)
	owner := stages.Owner{Name: cd.Name, Namespace: cd.Namespace}
	inv := &capstanv1.Inventory{}
	for i := range plan.Stages {
		if res := e.ApplyStage(ctx, &plan.Stages[i], owner); res.State == capstanv1.StageFailed {
			t.Fatal(res.Err)
		}
		stages.MergeInventory(inv, e.InventoryOf(&plan.Stages[i]), plan.Names())
	}
	cd.Status.Revision = "main@sha1:1111111111111111111111111111111111111111"
	cd.Status.Inventory = inv
	if err := c.Status().Update(ctx, cd); err != nil {
		t.Fatal(err)
	}
	return env
}

// serverURL is the test API server's address, which changes per run.
var serverURL = regexp.MustCompile(`https://127\.0\.0\.1:[0-9]+`)

func exitCode(err error) int {
	var exit *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.code
	}
	return -1
}

func TestDiffCommand(t *testing.T) {
	env := startShopCluster(t)
	kubeconfig := env.KubeconfigPath
	args := func(more ...string) []string {
		return append([]string{"diff", "--root", diffRoot, "--kubeconfig", kubeconfig}, more...)
	}
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		golden string   // file under testdata the output equals
		lines  []string // lines the output holds
	}{
		{
			name:   "the applied revision diffs to nothing and exits 0",
			args:   args("--deployment", "capstan-system/shop", "v1"),
			code:   diffExitNone,
			golden: "diff/unchanged.txt",
		},
		{
			name:   "every change, the prune and the Secret redacted, wrapped to the width; exits 1",
			args:   args("--deployment", "capstan-system/shop", "--width", "100", "v2"),
			code:   diffExitChanges,
			golden: "diff/changes.txt",
		},
		{
			name:   "-f takes the deployment from a file and the inventory from its live namesake",
			args:   args("-f", diffRoot+"/clusterdeployment.yaml", "--width", "100", "v2"),
			code:   diffExitChanges,
			golden: "diff/changes.txt",
		},
		{
			name:   "an object the server refuses is a problem with its field; exits 1",
			args:   args("--deployment", "capstan-system/shop", "invalid"),
			code:   diffExitChanges,
			golden: "diff/invalid.txt",
		},
		{
			name: "an object whose namespace the revision creates is checked in the deployment's namespace; exits 1",
			args: args("--deployment", "capstan-system/shop", "newns"),
			code: diffExitChanges,
			lines: []string{"Deployment shop-next/web: invalid (in testdata/diff/newns/shop.yaml) at spec.replicas: the API server refuses the object " +
				"(dry run in namespace capstan-system, its own being created by an earlier stage): " +
				`Deployment.apps "web" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0`},
		},
		{
			name:  "a path that does not render exits 2",
			args:  args("--deployment", "capstan-system/shop", "broken"),
			code:  diffExitError,
			lines: []string{"render testdata/diff/broken: "},
		},
		{
			name:  "a deployment that does not exist exits 2",
			args:  args("--deployment", "capstan-system/nope", "v2"),
			code:  diffExitError,
			lines: []string{"--deployment capstan-system/nope: no such ClusterDeployment in the cluster"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runCLI(t, tc.args...)
			if code := exitCode(err); code != tc.code {
				t.Fatalf("exit code %d (%v), want %d; output:\n%s", code, err, tc.code, out)
			}
			var exit *exitError
			if errors.As(err, &exit) && exit.err != nil {
				out += exit.err.Error() + "\n"
			}
			out = serverURL.ReplaceAllString(out, "https://127.0.0.1:PORT")
			for _, v := range plantedDiffSecrets {
				if strings.Contains(out, v) {
					t.Errorf("output shows the Secret value %q", v)
				}
			}
			if tc.golden != "" {
				golden(t, tc.golden, out)
			}
			for _, l := range tc.lines {
				if !strings.Contains(out, l) {
					t.Errorf("output lacks %q:\n%s", l, out)
				}
			}
		})
	}

	t.Run("-o json is the plan diff for machines", func(t *testing.T) {
		out, err := runCLI(t, args("--deployment", "capstan-system/shop", "-o", "json", "v2")...)
		if exitCode(err) != diffExitChanges {
			t.Fatalf("exit %v", err)
		}
		var report struct {
			Deployment   string          `json:"deployment"`
			LiveRevision string          `json:"liveRevision"`
			Diff         stages.PlanDiff `json:"diff"`
		}
		if err := json.Unmarshal([]byte(out), &report); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		c := report.Diff.Counts()
		if report.Deployment != "capstan-system/shop" || c.Create != 1 || c.Change != 3 || c.Delete != 1 || c.Unchanged != 1 {
			t.Errorf("report: %s, counts %+v", report.Deployment, c)
		}
		for _, v := range plantedDiffSecrets {
			if strings.Contains(out, v) {
				t.Errorf("json shows the Secret value %q", v)
			}
		}
		if *update {
			// The plan comment's golden test renders this very output.
			out = serverURL.ReplaceAllString(out, "https://127.0.0.1:PORT")
			if err := os.WriteFile("../../reconciler/report/testdata/plan/shop.json", []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("--decryption-key decrypts sops files in memory; their values stay hidden", func(t *testing.T) {
		id := sopstest.NewAgeKey(t)
		root := t.TempDir()
		const password = "decrypted-bmc-password"
		files := map[string]string{
			"sops/kustomization.yaml": "resources: [bmc.yaml]\n",
			"sops/bmc.yaml": sopstest.EncryptSecretYAML(t,
				"apiVersion: v1\nkind: Secret\nmetadata: {name: sops-bmc, namespace: capstan-system}\nstringData: {password: "+password+"}\n", id),
			"key.agekey": string(sopstest.AgeKeyFile(id)),
		}
		for name, content := range files {
			if err := os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		out, err := runCLI(t, "diff", "--root", root, "--kubeconfig", kubeconfig, "--decryption-key", filepath.Join(root, "key.agekey"), "sops")
		if code := exitCode(err); code != diffExitChanges {
			t.Fatalf("exit code %d (%v), want %d; output:\n%s", code, err, diffExitChanges, out)
		}
		if !strings.Contains(out, "+ Secret capstan-system/sops-bmc") || strings.Contains(out, password) || strings.Contains(out, "ENC[") || strings.Contains(out, "invalid") {
			t.Errorf("the diff of a decrypted Secret: want it created, without its value, ciphertext or a problem:\n%s", out)
		}
		// Without the key: an error naming the file and what to give,
		// not a diff of ciphertext.
		out, err = runCLI(t, "diff", "--root", root, "--kubeconfig", kubeconfig, "sops")
		if code := exitCode(err); code != diffExitError || !strings.Contains(err.Error(), "bmc.yaml") || !strings.Contains(err.Error(), "--decryption-key") {
			t.Errorf("without the key: exit %d, %v; want exit %d naming bmc.yaml and --decryption-key\n%s", code, err, diffExitError, out)
		}
	})

	// Last: it stops the API server.
	t.Run("an API server that does not answer exits 2, says so and what to check, and lists no object", func(t *testing.T) {
		if err := env.StopAPIServer(); err != nil {
			t.Fatal(err)
		}
		out, err := runCLI(t, args("--deployment", "capstan-system/shop", "v2")...)
		if code := exitCode(err); code != diffExitError {
			t.Fatalf("exit code %d (%v), want %d; output:\n%s", code, err, diffExitError, out)
		}
		msg := serverURL.ReplaceAllString(err.Error(), "https://127.0.0.1:PORT")
		for _, want := range []string{
			"the cluster at https://127.0.0.1:PORT could not be reached, so nothing was compared",
			"connection refused",
			"check that its API server is up and answers",
		} {
			if !strings.Contains(msg, want) {
				t.Errorf("error lacks %q:\n%s", want, msg)
			}
		}
		if out != "" {
			t.Errorf("printed a diff for a cluster it could not reach:\n%s", out)
		}
	})
}

func TestWrapLine(t *testing.T) {
	for _, tc := range []struct {
		line  string
		width int
		want  string
	}{
		{"  short\n", 20, "  short\n"},
		{"  one two three four five\n", 16, "  one two three\n      four five\n"},
		{"  aaaaaaaaaaaaaaaaaaaaaaaa\n", 16, "  aaaaaaaaaaaaaa\n      aaaaaaaaaa\n"},
		{"no wrap without a width\n", 0, "no wrap without a width\n"},
	} {
		if got := wrapLine(tc.line, tc.width); got != tc.want {
			t.Errorf("wrapLine(%q, %d) = %q, want %q", tc.line, tc.width, got, tc.want)
		}
	}
}

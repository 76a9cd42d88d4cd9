package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
)

// capstanCLI runs the capstan binary against the test control plane, as
// an operator would, and returns what it printed on stdout and stderr.
func capstanCLI(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, capstanBinary(t), append(args, "--kubeconfig", env.KubeconfigPath)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// twoOverlays are two one-ConfigMap overlays, clusters/app and
// clusters/witness, both at version.
func twoOverlays(ns, version string) map[string]string {
	files := gitOverlay(ns, version)
	files["clusters/witness/kustomization.yaml"] = "resources: [cm.yaml]\n"
	files["clusters/witness/cm.yaml"] = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: witness-config, namespace: " + ns + "}\n" +
		"data: {version: \"" + version + "\"}\n"
	return files
}

func configVersion(t *testing.T, ns, name string) any {
	t.Helper()
	cm := object(t, newClient(t), configMapGVK, ns, name)
	if cm == nil {
		return nil
	}
	return cm.Object["data"].(map[string]any)["version"]
}

// A suspended deployment applies nothing while a deployment beside it,
// reading the same repository at the same interval, rolls a new commit
// out; `capstan resume --wait` then brings it to the commit.
func TestSuspendHoldsACommitUntilResume(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	commit := func(version string) string {
		t.Helper()
		h, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoOverlays(ns, version), "version "+version)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	v1 := commit("1")
	startDaemon(t, nil)
	secret := gitSecret(t, c, ns)
	for _, name := range []string{"app", "witness"} {
		createDeployment(t, c, ns, name, capstanv1.ClusterDeploymentSpec{
			Source:   &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: secret}}},
			Path:     "clusters/" + name,
			Interval: &metav1.Duration{Duration: 500 * time.Millisecond},
		})
		waitDeployment(t, c, ns, name, "Ready at v1", func(cd *capstanv1.ClusterDeployment) bool {
			return isReady(cd) && cd.Status.Revision == "main@sha1:"+v1
		})
	}

	out, _, err := capstanCLI(t, "suspend", "app", "-n", ns)
	if err != nil || !strings.Contains(out, "ClusterDeployment "+ns+"/app suspended at main@sha1:"+v1[:8]) {
		t.Fatalf("capstan suspend: %v, printed %q", err, out)
	}
	cd := getDeployment(t, c, ns, "app")
	if !cd.Spec.Suspend {
		t.Fatal("spec.suspend is not set after capstan suspend")
	}
	if !managedBy(cd, "capstan-cli") {
		t.Errorf("no managedFields entry of capstan-cli: %+v", cd.ManagedFields)
	}
	if _, _, err := capstanCLI(t, "reconcile", "app", "-n", ns); err == nil {
		t.Error("capstan reconcile of a suspended deployment succeeded, want it refused")
	}
	out, _, err = capstanCLI(t, "get", "-n", ns, "--width", "200")
	if err != nil || !regexpLine(out, `^app\s+main@sha1:`+v1[:8]+`\s+True\s+True\s`) {
		t.Errorf("capstan get: %v, printed\n%s\nwant app suspended and Ready", err, out)
	}

	v2 := commit("2")
	waitDeployment(t, c, ns, "witness", "Ready at v2", func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && cd.Status.Revision == "main@sha1:"+v2
	})
	if got := getDeployment(t, c, ns, "app").Status.Revision; got != "main@sha1:"+v1 {
		t.Errorf("suspended deployment moved to %s", got)
	}
	if got := configVersion(t, ns, "app-config"); got != "1" {
		t.Errorf("app-config version = %v while suspended, want 1", got)
	}

	out, progress, err := capstanCLI(t, "resume", "app", "-n", ns, "--wait", "--timeout", "60s")
	if err != nil {
		t.Fatalf("capstan resume --wait: %v\nstdout: %s\nstderr: %s", err, out, progress)
	}
	if !strings.Contains(out, "resumed") || !strings.Contains(out, "is Ready at main@sha1:"+v2[:8]) {
		t.Errorf("capstan resume printed %q, want it resumed and Ready at %s", out, v2[:8])
	}
	if got := configVersion(t, ns, "app-config"); got != "2" {
		t.Errorf("app-config version = %v after resume, want 2", got)
	}
}

// With an interval of an hour, `capstan reconcile --with-source --wait`
// brings a new commit in at once and returns when it is Ready.
func TestReconcileWithSourceLandsACommitBeforeTheInterval(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	v1, err := gitSrv.Commit(ns, gitserver.DefaultBranch, gitOverlay(ns, "1"), "version 1")
	if err != nil {
		t.Fatal(err)
	}
	startDaemon(t, nil)
	createDeployment(t, c, ns, "app", capstanv1.ClusterDeploymentSpec{
		Source:   &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(t, c, ns)}}},
		Path:     "clusters/app",
		Interval: &metav1.Duration{Duration: time.Hour},
	})
	waitDeployment(t, c, ns, "app", "Ready at v1", func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && cd.Status.Revision == "main@sha1:"+v1
	})

	v2, err := gitSrv.Commit(ns, gitserver.DefaultBranch, gitOverlay(ns, "2"), "version 2")
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	out, progress, err := capstanCLI(t, "reconcile", "app", "-n", ns, "--with-source", "--wait", "--timeout", "60s")
	if err != nil {
		t.Fatalf("capstan reconcile --with-source --wait: %v\nstdout: %s\nstderr: %s", err, out, progress)
	}
	t.Logf("capstan reconcile --with-source --wait took %v (interval 1h)", time.Since(begin))
	if !strings.Contains(out, "is Ready at main@sha1:"+v2[:8]) {
		t.Errorf("capstan reconcile printed %q, want Ready at %s", out, v2[:8])
	}
	cd := getDeployment(t, c, ns, "app")
	if cd.Status.Revision != "main@sha1:"+v2 || cd.Status.LastHandledReconcileAt == "" ||
		cd.Status.LastHandledReconcileAt != cd.Annotations["capstan.dev/reconcile-requested-at"] {
		t.Errorf("status: revision %s, lastHandledReconcileAt %q, annotation %q; want v2 and the request handled",
			cd.Status.Revision, cd.Status.LastHandledReconcileAt, cd.Annotations["capstan.dev/reconcile-requested-at"])
	}
	if got := configVersion(t, ns, "app-config"); got != "2" {
		t.Errorf("app-config version = %v, want 2", got)
	}

	// A failing deployment makes --wait fail with its message.
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, map[string]string{"clusters/app/kustomization.yaml": "resources: [missing.yaml]\n"}, "break it"); err != nil {
		t.Fatal(err)
	}
	out, progress, err = capstanCLI(t, "reconcile", "app", "-n", ns, "--wait", "--timeout", "60s")
	if err == nil || !strings.Contains(progress, "missing.yaml") {
		t.Errorf("capstan reconcile --wait of a broken revision: %v\nstdout: %s\nstderr: %s\nwant a failure naming missing.yaml", err, out, progress)
	}
}

func managedBy(cd *capstanv1.ClusterDeployment, manager string) bool {
	for _, m := range cd.ManagedFields {
		if m.Manager == manager {
			return true
		}
	}
	return false
}

// regexpLine reports whether a line of out matches pattern.
func regexpLine(out, pattern string) bool {
	return regexp.MustCompile("(?m)" + pattern).MatchString(out)
}

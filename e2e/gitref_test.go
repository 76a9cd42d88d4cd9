package e2e

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
)

// gitOverlay is a one-ConfigMap overlay at clusters/app whose data names
// version.
func gitOverlay(ns, version string) map[string]string {
	return map[string]string{
		"clusters/app/kustomization.yaml": "resources: [cm.yaml]\n",
		"clusters/app/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app-config, namespace: " + ns + "}\n" +
			"data: {version: \"" + version + "\"}\n",
	}
}

// gitTag tags commit in the test server's repository repo, as a release
// script would; annotated makes it an annotated tag.
func gitTag(t testing.TB, repo, tag, commit string, annotated bool) {
	t.Helper()
	args := []string{"tag", tag, commit}
	if annotated {
		args = []string{"tag", "-a", "-m", "release " + tag, tag, commit}
	}
	cmd := exec.Command("git", args...)
	cmd.Env = append(os.Environ(), "GIT_DIR="+gitSrv.RepoPath(repo), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_COMMITTER_NAME=Capstan Test", "GIT_COMMITTER_EMAIL=test@capstan.dev")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// A deployment that follows a semver range applies the highest release
// tag, not the branch beyond it, and rolls out a new matching tag when it
// is pushed.
func TestGitSemverRefFollowsANewTag(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	commit := func(version string) string {
		t.Helper()
		h, err := gitSrv.Commit(ns, gitserver.DefaultBranch, gitOverlay(ns, version), "version "+version)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	v1 := commit("1")
	gitTag(t, ns, "v1.0.0", v1, true)
	commit("unreleased") // main moves on; no tag names it

	startDaemon(t, nil)
	createDeployment(t, c, ns, "app", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, Ref: capstanv1.GitRef{SemVer: ">=1.0.0"}, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(t, c, ns)},
		}},
		Path:     "clusters/app",
		Interval: &metav1.Duration{Duration: 500 * time.Millisecond},
	})
	want := "v1.0.0@sha1:" + v1 // the annotated tag's commit
	waitDeployment(t, c, ns, "app", "Ready at "+want, func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && cd.Status.Revision == want
	})
	if got := object(t, c, configMapGVK, ns, "app-config"); got == nil || got.Object["data"].(map[string]any)["version"] != "1" {
		t.Fatalf("app-config = %v, want version 1", got)
	}

	v11 := commit("1.1")
	tagged := time.Now()
	gitTag(t, ns, "v1.1.0", v11, false)
	want = "v1.1.0@sha1:" + v11
	waitDeployment(t, c, ns, "app", "Ready at "+want, func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && cd.Status.Revision == want
	})
	t.Logf("tag v1.1.0 to Ready at it: %v (poll interval 500ms)", time.Since(tagged))
	if got := object(t, c, configMapGVK, ns, "app-config"); got == nil || got.Object["data"].(map[string]any)["version"] != "1.1" {
		t.Fatalf("app-config = %v, want version 1.1", got)
	}
}

// The CRD refuses a ref that sets two kinds, or a short commit, before
// anything reads it.
func TestGitRefValidation(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	tests := []struct {
		name string
		ref  capstanv1.GitRef
		want string
	}{
		{name: "a branch and a tag", ref: capstanv1.GitRef{Branch: "main", Tag: "v1"}, want: "set at most one of branch, tag, semver, commit and name"},
		{name: "a short commit", ref: capstanv1.GitRef{Commit: "4f2c9a1"}, want: "commit must be a full 40-digit lower-case SHA-1"},
		{name: "a short ref name", ref: capstanv1.GitRef{Name: "pull/7/head"}, want: "name must be a full ref name"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cd := &capstanv1.ClusterDeployment{
				ObjectMeta: metav1.ObjectMeta{Name: "bad-ref-" + string(rune('a'+i)), Namespace: ns},
				Spec: capstanv1.ClusterDeploymentSpec{
					Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: "https://git.example/infra.git", Ref: tt.ref}},
					Path:   "clusters/app",
				},
			}
			err := c.Create(context.Background(), cd)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Create = %v, want an error saying %q", err, tt.want)
			}
		})
	}
}

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/sources/git"
)

// rootCluster is a committed cluster: a ClusterDeployment without its own
// source (it reads the root's) and a one-stage overlay.
func rootCluster(name, ns string) map[string]string {
	dir := "clusters/" + name
	return map[string]string{
		dir + "/clusterdeployment.yaml": `apiVersion: capstan.dev/v1alpha1
kind: ClusterDeployment
metadata:
  name: ` + name + `
spec:
  path: ` + dir + `/overlay
  interval: 500ms
  substitute: {NS: ` + ns + `}
`,
		dir + "/overlay/kustomization.yaml": "resources: [cm.yaml]\n",
		dir + "/overlay/cm.yaml": `apiVersion: v1
kind: ConfigMap
metadata: {name: ` + name + `-settings, namespace: "${NS}"}
data: {cluster: ` + name + `}
`,
	}
}

// Adding a cluster is a git push; removing it stops managing it and keeps
// what it applied.
func TestRootSourceManagesCommittedDeployments(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, rootCluster("alpha", ns), "add alpha"); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, &reconciler.RootOptions{
		URL: url, Branch: "main", Path: "clusters", Namespace: ns, Interval: 500 * time.Millisecond,
		Auth: git.Auth{Username: "capstan", Password: "s3cret-token"},
	})
	waitDeployment(t, c, ns, "alpha", "Ready", isReady)
	if object(t, c, configMapGVK, ns, "alpha-settings") == nil {
		t.Fatal("alpha Ready but its ConfigMap is missing")
	}

	pushed := time.Now()
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, rootCluster("beta", ns), "add beta"); err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c, ns, "beta", "Ready", isReady)
	t.Logf("git push of a new cluster -> Ready in %s", time.Since(pushed))
	beta := getDeployment(t, c, ns, "beta")
	if beta.Labels[reconciler.RootLabel] == "" {
		t.Errorf("beta has no %s label", reconciler.RootLabel)
	}

	removal := map[string]string{}
	for path := range rootCluster("alpha", ns) {
		removal[path] = gitserver.Deleted
	}
	removed, err := gitSrv.Commit(ns, gitserver.DefaultBranch, removal, "remove alpha")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "alpha to be no longer managed", func() (bool, error) {
		err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "alpha"}, &capstanv1.ClusterDeployment{})
		return apierrors.IsNotFound(err), err
	})
	// Its deletion policy is the default, Delete: what it applied goes.
	if object(t, c, configMapGVK, ns, "alpha-settings") != nil {
		t.Error("removing alpha from git left its ConfigMap; deletionPolicy Delete (the default) deletes it")
	}
	// beta reads the same repository, so the removal is a new revision for
	// it too: it walks its stages again and is Ready at that revision.
	waitDeployment(t, c, ns, "beta", "Ready at the revision without alpha", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Revision == "main@sha1:"+removed && isReady(cd)
	})
}

// A broken ClusterDeployment file is reported and does not stop the others
// from being applied, nor get any deployment deleted.
func TestRootSourceBrokenFileIsReported(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	files := rootCluster("gamma", ns)
	files["clusters/broken/clusterdeployment.yaml"] = "apiVersion: capstan.dev/v1alpha1\nkind: ClusterDeployment\nmetadata: {name: broken\nspec: [\n"
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "gamma and a broken file"); err != nil {
		t.Fatal(err)
	}
	d, _ := startDaemon(t, &reconciler.RootOptions{
		URL: url, Path: "clusters", Namespace: ns, Interval: 500 * time.Millisecond,
		Auth: git.Auth{Username: "capstan", Password: "s3cret-token"},
	})
	waitDeployment(t, c, ns, "gamma", "Ready", isReady)
	waitFor(t, "the root source to report the broken file", func() (bool, error) {
		st := d.RootStatus()
		return st.Err != nil && strings.Contains(st.Err.Error(), "clusters/broken/clusterdeployment.yaml"), st.Err
	})
	// The set of files is incomplete, so nothing was pruned and the
	// revision is not marked synced: it is read again on the next poll.
	if st := d.RootStatus(); st.Revision != "" {
		t.Errorf("root revision %q marked synced despite a broken file", st.Revision)
	}
}

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testca"
	"github.com/capstan-dev/capstan/reconciler/report"
)

// A company forge behind its own CA: the daemon fetches and applies the
// deployment's revision, commits its status and comments the plan of a
// pull request, and `capstan diff --pr` plans it too, all through an https
// proxy in front of Gitea whose certificate a CA made here signed, with
// nothing but ca.crt added to the Secrets the deployment names.
func TestPrivateCAForTheWholeRoundTrip(t *testing.T) {
	s := realGitea(t)
	ctx := context.Background()
	c := newClient(t)
	ns := newNamespace(t)
	ca := testca.Must(t, "capstan-e2e-company-ca")
	proxy := ca.ProxyFor(t, s.URL())
	repo, err := s.CreateRepo(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, repo, "main", edgeFiles(2, plantedFirst), "the edge cluster"); err != nil {
		t.Fatal(err)
	}
	giteaSecrets(t, s, c, ns)
	for _, name := range []string{"git-auth", "forge-token"} {
		secret := &corev1.Secret{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, secret); err != nil {
			t.Fatal(err)
		}
		secret.Data["ca.crt"] = ca.PEM
		if err := c.Update(ctx, secret); err != nil {
			t.Fatal(err)
		}
	}
	startDaemonWith(t, nil, nil)
	createDeployment(t, c, ns, "edge", edgeSpec(proxy.URL+"/"+repo.String()+".git", ns, "git-auth", "forge-token", proxy.URL))
	waitDeployment(t, c, ns, "edge", "stage Config applied from the https source", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "Config").State == capstanv1.StageReady
	})

	head, err := s.Commit(ctx, repo, "scale", edgeFiles(3, plantedFirst), "Scale edge to 3 workers")
	if err != nil {
		t.Fatal(err)
	}
	pr, err := s.OpenPullRequest(ctx, repo, "scale", "main", "Scale edge to 3 workers")
	if err != nil {
		t.Fatal(err)
	}
	waitComment(t, s, repo, pr.Number, "the plan, through the proxy", func(b string) bool { return strings.Contains(b, head) })
	status := "origin/" + capstanv1.DefaultStatusBranch + ":" + report.Path(ns, "edge")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		out, err := giteaGit(t, s, repo, "show", status)
		if err == nil && strings.Contains(out, "name: Config") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no status commit %s through the proxy within a minute: %v\n%s", status, err, out)
		}
	}

	// The CLI reads the token and ca.crt from the same Secret.
	cli := exec.Command(capstanBinary(t), "diff", "--pr", fmt.Sprint(pr.Number), "--deployment", ns+"/edge", "--kubeconfig", env.KubeconfigPath)
	out, _ := cli.CombinedOutput()
	if code := cli.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), "spec.replicas: 2 -> 3") {
		t.Errorf("capstan diff --pr through the proxy: exit %d, want 1 with the plan of %s:\n%s", code, head, out)
	}
}

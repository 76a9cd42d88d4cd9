package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// diffOutput is what `capstan diff -o json` prints.
type diffOutput struct {
	Diff stages.PlanDiff `json:"diff"`
}

// runDiff runs `capstan diff -o json` with args against the test control
// plane and returns its diff and exit code.
func runDiff(t *testing.T, args ...string) (stages.PlanDiff, int) {
	t.Helper()
	cli := exec.Command(capstanBinary(t), append([]string{"diff", "-o", "json", "--kubeconfig", env.KubeconfigPath}, args...)...)
	var stderr strings.Builder
	cli.Stderr = &stderr
	out, err := cli.Output()
	code := cli.ProcessState.ExitCode()
	if code == 2 || (err != nil && code < 0) {
		t.Fatalf("capstan diff %v: exit %d (%v):\n%s%s", args, code, err, stderr.String(), out)
	}
	var got diffOutput
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("capstan diff %v printed no JSON diff: %v\n%s", args, err, out)
	}
	return got.Diff, code
}

// stageDiff returns the stage named name of d.
func stageDiff(t *testing.T, d stages.PlanDiff, name string) stages.StageDiff {
	t.Helper()
	for _, s := range d.Stages {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("the diff has no stage %s: %+v", name, d.Stages)
	return stages.StageDiff{}
}

// objectAction returns what d does to the object named ref in stage (""
// for the prune), or "" when d does not list it.
func objectAction(d stages.PlanDiff, stage, ref string) stages.DiffAction {
	objects := d.Prune
	for _, s := range d.Stages {
		if s.Name == stage {
			objects = s.Objects
		}
	}
	for _, o := range objects {
		if o.Ref == ref {
			return o.Action
		}
	}
	return ""
}

// diffAcrossClusters checks that `capstan diff` (and the pull request
// plans, which share its code) compares each stage with the cluster it
// acts on, and lists the stages of a cluster it cannot reach as not
// compared while comparing the rest.
func diffAcrossClusters(t *testing.T, tg *target) {
	c := newClient(t)
	ns := newNamespace(t)
	url := newRemoteRepo(t, ns)
	dir := t.TempDir()
	writeFiles(t, dir, remoteFiles())
	remoteCM, localCM := "ConfigMap/"+ns+"/remote-settings", "ConfigMap/"+ns+"/local-settings"
	deploymentFile := func(secret string) string {
		cd := capstanv1.ClusterDeployment{Spec: remoteSpec(url, ns, "git", kubeconfigRef(secret))}
		cd.APIVersion, cd.Kind = capstanv1.GroupVersion.String(), "ClusterDeployment"
		cd.Name, cd.Namespace = "remote", ns
		data, err := yaml.Marshal(cd)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), "clusterdeployment.yaml")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// A cluster not built yet (no kubeconfig Secret) and one that does
	// not answer: their stage is not compared, the other one is.
	writeKubeconfigSecret(t, c, ns, "down-kubeconfig", tg.unreachableKubeconfig(t))
	for secret, says := range map[string]string{
		"missing-kubeconfig": "Secret " + ns + "/missing-kubeconfig unreachable: the kubeconfig Secret does not exist",
		"down-kubeconfig":    "Secret " + ns + "/down-kubeconfig unreachable",
	} {
		d, code := runDiff(t, "--root", dir, "-f", deploymentFile(secret), "clusters/remote")
		remote, local := stageDiff(t, d, "Remote"), stageDiff(t, d, "Local")
		if !strings.Contains(remote.NotCompared, says) || remote.Cluster != "Secret "+ns+"/"+secret {
			t.Errorf("%s: stage Remote on %q not compared because %q, want on Secret %s/%s because %q", secret, remote.Cluster, remote.NotCompared, ns, secret, says)
		}
		if got := objectAction(d, "Remote", remoteCM); got != stages.DiffNotCompared {
			t.Errorf("%s: %s is %q, want %q", secret, remoteCM, got, stages.DiffNotCompared)
		}
		if got := objectAction(d, "Local", localCM); got != stages.DiffCreate || local.Cluster != "" || local.NotCompared != "" {
			t.Errorf("%s: stage Local: %s is %q on %q (%s), want create, compared here", secret, localCM, got, local.Cluster, local.NotCompared)
		}
		if code != 1 {
			t.Errorf("%s: exit %d, want 1: a diff that could not compare a stage cannot say nothing changes", secret, code)
		}
	}

	// Deployed: each stage's objects are found where they were applied.
	writeKubeconfigSecret(t, c, ns, "target-kubeconfig", tg.kubeconfig)
	startDaemon(t, nil)
	createDeployment(t, c, ns, "remote", remoteSpec(url, ns, gitSecret(t, c, ns), kubeconfigRef("target-kubeconfig")))
	waitDeployment(t, c, ns, "remote", "stage Remote waiting for its mark", stageWaits("Remote", remoteCM))
	remote := object(t, tg.client, configMapGVK, ns, "remote-settings")
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"`+remoteReadyAnnotation+`":"true"}}}`))
	if err := tg.client.Patch(context.Background(), remote, patch); err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c, ns, "remote", "Ready", isReady)

	d, code := runDiff(t, "--root", dir, "--deployment", ns+"/remote", "clusters/remote")
	if got := objectAction(d, "Remote", remoteCM); got != stages.DiffUnchanged || code != 0 {
		t.Errorf("the deployed overlay: %s is %q (exit %d), want unchanged (exit 0): compared with the target, where it was applied", remoteCM, got, code)
	}
	if s := stageDiff(t, d, "Remote"); s.Cluster != "Secret "+ns+"/target-kubeconfig" {
		t.Errorf("stage Remote compared on %q, want the cluster of Secret %s/target-kubeconfig", s.Cluster, ns)
	}

	// A change to the remote object, and one that drops it: the change
	// and the prune are the target's.
	files := remoteFiles()
	files["clusters/remote/remote.yaml"] = strings.Replace(files["clusters/remote/remote.yaml"], "where: target", "where: moved", 1)
	writeFiles(t, dir, files)
	d, _ = runDiff(t, "--root", dir, "--deployment", ns+"/remote", "clusters/remote")
	if got := objectAction(d, "Remote", remoteCM); got != stages.DiffChange {
		t.Errorf("a changed remote object is %q, want change", got)
	}
	files["clusters/remote/remote.yaml"] = strings.SplitN(files["clusters/remote/remote.yaml"], "---", 2)[0]
	writeFiles(t, dir, files)
	d, _ = runDiff(t, "--root", dir, "--deployment", ns+"/remote", "clusters/remote")
	if got := objectAction(d, "", remoteCM); got != stages.DiffDelete {
		t.Errorf("a remote object the overlay drops is %q in the prune, want delete: %+v", got, d.Prune)
	}
}

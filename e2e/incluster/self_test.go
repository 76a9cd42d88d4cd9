package incluster

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/stages"
)

// daemonDeployment is the name of the daemon's Deployment.
const daemonDeployment = "capstan"

// selfFiles is a ClusterDeployment of the root repository that manages
// Capstan's own Deployment: deployment is the Deployment as `capstan
// install --export` prints it, marked for adoption and with a pod
// template annotation the test changes.
func selfFiles(t testing.TB, deployment *unstructured.Unstructured) map[string]string {
	t.Helper()
	data, err := yaml.Marshal(deployment.Object)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"apps/capstan/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [deployment.yaml]\n",
		"apps/capstan/deployment.yaml":    string(data),
		"clusters/capstan.yaml": `apiVersion: capstan.dev/v1alpha1
kind: ClusterDeployment
metadata: {name: capstan, namespace: ` + capstanNS + `}
spec:
  path: apps/capstan
  interval: 2s
  deletionPolicy: Orphan
  stages:
    - name: Daemon
`,
	}
}

// exportedDeployment is the Deployment of `capstan install --export` with
// this suite's flags.
func exportedDeployment(t testing.TB) *unstructured.Unstructured {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), binPath, append(installArgs(t), "--export")...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("capstan install --export: %v\n%s", err, stderr.String())
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			t.Fatalf("no Deployment in the export: %v", err)
		}
		if u.GetKind() == "Deployment" && u.GetName() == daemonDeployment {
			return u
		}
	}
}

// testManagesItself commits Capstan's own Deployment to the root
// repository, as an operator who upgrades Capstan through git does, with
// a change to its pod template. The leader applies it and is replaced by
// the pod of the new template; that pod takes the Lease and brings the
// deployment to Ready at the commit, while the demo deployment stays Ready.
func testManagesItself(t *testing.T, c client.Client) {
	ctx := t.Context()
	before := daemonPod(t, c)
	deployment := exportedDeployment(t)
	deployment.SetAnnotations(map[string]string{stages.AdoptAnnotation: "true"})
	deployment.SetLabels(map[string]string{stages.StageKey: "Daemon"})
	const mark = "test.capstan.dev/from-git"
	if err := unstructured.SetNestedStringMap(deployment.Object, map[string]string{mark: "1"}, "spec", "template", "metadata", "annotations"); err != nil {
		t.Fatal(err)
	}
	commit, err := gitSrv.Commit(repoName, "main", selfFiles(t, deployment), "Capstan manages its own Deployment")
	if err != nil {
		t.Fatal(err)
	}
	pushed := time.Now()

	key := client.ObjectKey{Namespace: capstanNS, Name: "capstan"}
	var cd capstanv1.ClusterDeployment
	waitFor(t, "ClusterDeployment capstan Ready at the commit", func() (bool, string, error) {
		if err := c.Get(ctx, key, &cd); err != nil {
			return false, "", err
		}
		ready := metaCondition(cd.Status.Conditions, capstanv1.ConditionReady)
		if ready == nil {
			return false, "no Ready condition", nil
		}
		return ready.Status == metav1.ConditionTrue && ready.ObservedGeneration == cd.Generation && strings.Contains(cd.Status.Revision, commit[:8]),
			cd.Status.Revision + " " + ready.Reason + ": " + ready.Message, nil
	})
	t.Logf("Capstan's own Deployment from git: Ready %s after the commit; stage Daemon: %d attempts",
		time.Since(pushed).Round(100*time.Millisecond), stage(&cd, "Daemon").Attempts)

	var d appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKey{Namespace: capstanNS, Name: daemonDeployment}, &d); err != nil {
		t.Fatal(err)
	}
	if d.Spec.Template.Annotations[mark] != "1" || d.Labels[stages.OwnerGroup+"/name"] != "capstan" {
		t.Errorf("the Deployment has template annotations %v and labels %v; want %s from git and the owner label of ClusterDeployment capstan",
			d.Spec.Template.Annotations, d.Labels, mark)
	}
	after := daemonPod(t, c)
	if after.UID == before.UID || after.Annotations[mark] != "1" || !podReady(after) {
		t.Errorf("the daemon's pod is %s (Ready %v, annotations %v); want a new, Ready pod of the template from git (the old one was %s)",
			after.Name, podReady(after), after.Annotations, before.Name)
	}
	if holder := leaseHolder(t, c); !strings.HasPrefix(holder, after.Name) {
		t.Errorf("the Lease is held by %q, want the new pod %s", holder, after.Name)
	}
	if demo := waitReady(t, c); demo.Status.Revision == "" {
		t.Error("the demo deployment has no revision after Capstan replaced itself")
	}

	// Out of git again: the ClusterDeployment goes, the Deployment stays.
	if _, err := gitSrv.Commit(repoName, "main", map[string]string{
		"clusters/capstan.yaml": gitserver.Deleted, "apps/capstan/deployment.yaml": gitserver.Deleted, "apps/capstan/kustomization.yaml": gitserver.Deleted,
	}, "Capstan's Deployment is no longer managed from git"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ClusterDeployment capstan gone", func() (bool, string, error) {
		err := c.Get(ctx, key, &capstanv1.ClusterDeployment{})
		if err == nil {
			return false, "still there", nil
		}
		return client.IgnoreNotFound(err) == nil, err.Error(), client.IgnoreNotFound(err)
	})
	if p := daemonPod(t, c); p.UID != after.UID {
		t.Errorf("the daemon's pod changed from %s to %s when its deployment left git (deletionPolicy Orphan)", after.Name, p.Name)
	}
}

// metaCondition returns the condition of type typ, or nil.
func metaCondition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

package incluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/stages/pivot"
)

const (
	pivotNS   = "pivot-e2e"
	pivotRepo = "movable"
)

// pivotRepoFiles: stage Config applies a ConfigMap in the bootstrap
// cluster, Pivot moves it and the deployment into the node's cluster,
// After applies a ConfigMap there, by the Capstan the pivot installed.
var pivotRepoFiles = map[string]string{
	"clusters/movable/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [config.yaml]\n",
	"clusters/movable/config.yaml": `apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: ` + pivotNS + `, labels: {capstan.dev/stage: Config}}
data: {moved: "yes"}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: after, namespace: ` + pivotNS + `, labels: {capstan.dev/stage: After}}
data: {applied: by the target}
`,
}

// TestPivotHandsOverToTheInstalledCapstan is the handover of issue 12
// for real: `capstan run` against a bootstrap control plane (a process on
// this machine, as on a bootstrap host) moves a deployment into the
// suite's cluster, installs its own image there, and the daemon pod that
// starts on the node takes the deployment over and runs the stage after
// the pivot. The bootstrap keeps a mirror whose status follows the
// target's. No Secret value appears in either daemon's log, in events or
// in status.
func TestPivotHandsOverToTheInstalledCapstan(t *testing.T) {
	if !cl.HostNetwork() {
		t.Skipf("backend %T: the installed Capstan must reach the API server at the kubeconfig's address, which only host-network nodes do", cl)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	benv, err := testenv.Start(ctx, testenv.Options{CRDDirs: []string{"../../manifests/crds"}, Progress: io.Discard})
	if err != nil {
		t.Fatalf("start the bootstrap control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := benv.Stop(); err != nil {
			t.Errorf("stop the bootstrap control plane: %v", err)
		}
	})
	bc, err := client.New(benv.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	tc := newClient(t)
	targetKubeconfig, err := os.ReadFile(cl.KubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.CreateRepo(pivotRepo); err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(pivotRepo, "main", pivotRepoFiles, "a deployment that moves"); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pivotNS}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "git-auth", Namespace: pivotNS},
			StringData: map[string]string{"username": gitUser, "password": gitPassword}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "target-kubeconfig", Namespace: pivotNS},
			Data: map[string][]byte{"value": targetKubeconfig}},
		&capstanv1.ClusterDeployment{
			ObjectMeta: metav1.ObjectMeta{Name: "movable", Namespace: pivotNS},
			Spec: capstanv1.ClusterDeploymentSpec{
				Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
					URL: strings.Replace(gitSrv.HTTPURL(pivotRepo), "127.0.0.1", cl.HostAddress(), 1), Ref: capstanv1.GitRef{Branch: "main"},
					SecretRef: &capstanv1.LocalObjectReference{Name: "git-auth"},
				}},
				Path:     "clusters/movable",
				Interval: &metav1.Duration{Duration: 2 * time.Second},
				Stages: []capstanv1.StageSpec{
					{Name: "Config"},
					{Name: "Pivot", Action: capstanv1.StageActionPivot,
						KubeConfig: &capstanv1.KubeConfigReference{SecretRef: &capstanv1.SecretKeyReference{Name: "target-kubeconfig"}}},
					{Name: "After"},
				},
			},
		},
	} {
		if err := bc.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// The suite's cluster goes on: leave it without Capstan. (t's
		// context is done by now.)
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, binPath, "uninstall", "--force", "--timeout", "3m", "--kubeconfig", cl.KubeconfigPath()).CombinedOutput()
		if err != nil {
			t.Errorf("capstan uninstall after the pivot: %v\n%s", err, out)
		}
	})

	// The bootstrap Capstan: a process, as on a bootstrap host, that knows
	// its image and installs it into the target.
	log := &syncBuffer{}
	metricsPort, healthPort := freePort(t), freePort(t)
	cmd := exec.Command(binPath, "run", "--kubeconfig", benv.KubeconfigPath,
		"--image", imageRef, "--cluster-name", "bootstrap",
		"--pivot-metrics-port", strconv.Itoa(metricsPort), "--pivot-health-port", strconv.Itoa(healthPort),
		"--mirror-interval", "2s", "--wait-slice", "3s",
		"--leader-elect=false", "--metrics-addr", "0", "--health-addr", "0", "--log-format", "text")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("bootstrap daemon log:\n%s", tail(log.String(), 60))
		}
	})

	begin := time.Now()
	there := &capstanv1.ClusterDeployment{}
	waitFor(t, "the installed Capstan to take the deployment over and finish it", func() (bool, string, error) {
		if err := tc.Get(ctx, client.ObjectKey{Namespace: pivotNS, Name: "movable"}, there); err != nil {
			return false, err.Error(), nil
		}
		for _, c := range there.Status.Conditions {
			if c.Type == capstanv1.ConditionReady {
				return c.Status == metav1.ConditionTrue, c.Message, nil
			}
		}
		return false, "no Ready condition", nil
	})
	t.Logf("target Ready %s after the bootstrap daemon started", time.Since(begin).Round(time.Millisecond))

	// The daemon pod runs the suite's image on the node and leads.
	pod := daemonPod(t, tc)
	if pod.Spec.NodeName == "" || pod.Spec.Containers[0].Image != imageRef {
		t.Errorf("installed pod %s: node %q, image %q; want %s on the node", pod.Name, pod.Spec.NodeName, pod.Spec.Containers[0].Image, imageRef)
	}
	holder := leaseHolder(t, tc)
	if !strings.HasPrefix(holder, pod.Name) {
		t.Errorf("leader Lease held by %q, want the installed pod %s", holder, pod.Name)
	}
	targetID, err := pivot.ClusterID(ctx, tc)
	if err != nil {
		t.Fatal(err)
	}
	if there.Status.Pivot == nil || there.Status.Pivot.Owner != targetID {
		t.Errorf("target status.pivot = %+v; want owned by the target (%s)", there.Status.Pivot, targetID)
	}
	after := &corev1.ConfigMap{}
	if err := tc.Get(ctx, client.ObjectKey{Namespace: pivotNS, Name: "after"}, after); err != nil {
		t.Errorf("stage After's ConfigMap is not in the target: %v", err)
	}
	if err := bc.Get(ctx, client.ObjectKey{Namespace: pivotNS, Name: "after"}, &corev1.ConfigMap{}); err == nil {
		t.Error("stage After's ConfigMap reached the bootstrap cluster")
	}

	// The bootstrap's mirror: handed over, following the target.
	waitFor(t, "the bootstrap's mirror to follow the target", func() (bool, string, error) {
		cd := &capstanv1.ClusterDeployment{}
		if err := bc.Get(ctx, client.ObjectKey{Namespace: pivotNS, Name: "movable"}, cd); err != nil {
			return false, "", err
		}
		if cd.Status.Pivot == nil {
			return false, "no status.pivot", nil
		}
		return cd.Status.Pivot.Phase == capstanv1.PivotCleanedUp && cd.Status.Pivot.MirroredAt != nil && stage(cd, "After").State == capstanv1.StageReady,
			fmt.Sprintf("phase %s, After %s", cd.Status.Pivot.Phase, stage(cd, "After").State), nil
	})
	if err := bc.Get(ctx, client.ObjectKey{Namespace: pivotNS, Name: "settings"}, &corev1.ConfigMap{}); err == nil {
		t.Error("the moved ConfigMap is still in the bootstrap cluster")
	}

	// Secrets stay secret: the git password and the target's credentials
	// moved, and none of them is in a log, an event or a status.
	podLog, err := cl.PodLogs(ctx, capstanNS, pod.Name, "capstan")
	if err != nil {
		t.Fatal(err)
	}
	secrets := secretValues(t, targetKubeconfig)
	texts := map[string]string{"the bootstrap daemon's log": log.String(), "the installed daemon's log": podLog}
	for side, c := range map[string]client.Client{"bootstrap": bc, "target": tc} {
		cd := &capstanv1.ClusterDeployment{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: pivotNS, Name: "movable"}, cd); err != nil {
			t.Fatal(err)
		}
		texts["the "+side+" deployment's status"] = fmt.Sprintf("%+v", cd.Status)
		var events eventsv1.EventList
		if err := c.List(ctx, &events, client.InNamespace(pivotNS)); err != nil {
			t.Fatal(err)
		}
		for _, e := range events.Items {
			texts["the "+side+" events"] += e.Reason + ": " + e.Note + "\n"
		}
	}
	if ev := texts["the bootstrap events"]; !strings.Contains(ev, "Pivoted: stage Pivot: moved ") || !strings.Contains(ev, "handed over to the Capstan there") {
		t.Errorf("no Pivoted event in the bootstrap cluster:\n%s", texts["the bootstrap events"])
	}
	for where, text := range texts {
		for name, value := range secrets {
			if strings.Contains(text, value) {
				t.Errorf("%s holds %s", where, name)
			}
		}
	}
}

// secretValues are the values that must never be shown: the git password
// and the credentials in the target's kubeconfig.
func secretValues(t *testing.T, kubeconfig []byte) map[string]string {
	t.Helper()
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{"the git password": gitPassword}
	for name, a := range cfg.AuthInfos {
		if len(a.ClientKeyData) > 0 {
			out["the client key of "+name] = string(a.ClientKeyData)
			// A log would rather show it base64-encoded, as in the Secret.
			out["the client key line of "+name] = strings.Split(strings.TrimSpace(string(a.ClientKeyData)), "\n")[1]
		}
		if a.Token != "" {
			out["the token of "+name] = a.Token
		}
	}
	return out
}

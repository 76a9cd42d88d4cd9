package e2e

import (
	"context"
	"io"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// pivotFiles is an overlay whose second stage moves the deployment into
// the target: Config applies a ConfigMap here, Pivot moves it (and the
// deployment, and the Secrets it names) there, After belongs to the
// Capstan of the target.
func pivotFiles(ns string) map[string]string {
	return map[string]string{
		"clusters/pivot/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [config.yaml]\n",
		"clusters/pivot/config.yaml": `apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: ` + ns + `, labels: {capstan.dev/stage: Config}}
data: {moved: "yes"}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: after, namespace: ` + ns + `, labels: {capstan.dev/stage: After}}
data: {applied: by the target}
`,
	}
}

// A pivot stage moves the deployment, what it applied and the Secrets it
// names into the cluster of its kubeConfig: there the deployment arrives
// marked and unsuspended, its objects with Capstan's labels; here the
// deployment stays as a suspended mirror, the moved ConfigMap is gone,
// and no stage after the pivot runs.
func TestPivotStageMovesTheDeployment(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tenv, err := testenv.Start(ctx, testenv.Options{CRDDirs: []string{"../manifests/crds"}, Progress: io.Discard})
	if err != nil {
		t.Fatalf("start the target control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := tenv.Stop(); err != nil {
			t.Errorf("stop the target: %v", err)
		}
	})
	tc, err := client.New(tenv.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := os.ReadFile(tenv.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}

	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, pivotFiles(ns), "a deployment that moves"); err != nil {
		t.Fatal(err)
	}
	writeKubeconfigSecret(t, c, ns, "target-kubeconfig", kubeconfig)
	startDaemon(t, nil)
	createDeployment(t, c, ns, "movable", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, Ref: capstanv1.GitRef{Branch: "main"}, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(t, c, ns)},
		}},
		Path: "clusters/pivot",
		Stages: []capstanv1.StageSpec{
			{Name: "Config"},
			{Name: "Pivot", Action: capstanv1.StageActionPivot, KubeConfig: kubeconfigRef("target-kubeconfig")},
			{Name: "After"},
		},
	})

	cd := waitDeployment(t, c, ns, "movable", "stage Pivot Ready", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "Pivot").State == capstanv1.StageReady
	})
	waitFor(t, "the deployment here to be a suspended mirror", func() (bool, error) {
		cd := getDeployment(t, c, ns, "movable")
		return cd.Spec.Suspend && cd.Annotations[pivot.MirrorAnnotation] != "", nil
	})

	// Here: the moved ConfigMap is gone, After never ran.
	if object(t, c, configMapGVK, ns, "settings") != nil {
		t.Error("ConfigMap settings is still in the source after the move")
	}
	if st := stage(getDeployment(t, c, ns, "movable"), "After"); st.State == capstanv1.StageReady || object(t, c, configMapGVK, ns, "after") != nil {
		t.Errorf("stage After ran in the source (%s); it is the target's", st.State)
	}

	// There: the ConfigMap with Capstan's labels, the deployment marked and
	// running, and the Secrets it needs to go on.
	moved := object(t, tc, configMapGVK, ns, "settings")
	if moved == nil {
		t.Fatal("ConfigMap settings is not in the target")
	}
	if moved.GetLabels()["capstan.dev/name"] != "movable" {
		t.Errorf("the moved ConfigMap lost Capstan's labels: %v", moved.GetLabels())
	}
	there := &capstanv1.ClusterDeployment{}
	if err := tc.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "movable"}, there); err != nil {
		t.Fatalf("the deployment is not in the target: %v", err)
	}
	if there.Spec.Suspend || there.Annotations[pivot.ArrivedAnnotation] == "" {
		t.Errorf("the deployment in the target: suspend %t, annotations %v; want it running and marked as arrived", there.Spec.Suspend, there.Annotations)
	}
	for _, name := range []string{"target-kubeconfig", cd.Spec.Source.Git.SecretRef.Name} {
		if err := tc.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &corev1.Secret{}); err != nil {
			t.Errorf("Secret %s, which the deployment names, did not move: %v", name, err)
		}
	}

	// The Capstan of the target finds its pivot stage done and goes on.
	targetDaemon(t, tenv)
	done := &capstanv1.ClusterDeployment{}
	waitFor(t, "the target's Capstan to finish the deployment", func() (bool, error) {
		if err := tc.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "movable"}, done); err != nil {
			return false, err
		}
		return isReady(done), nil
	})
	if st := stage(done, "Pivot"); st.State != capstanv1.StageReady {
		t.Errorf("the target's Pivot stage is %s", st.State)
	}
	if object(t, tc, configMapGVK, ns, "after") == nil {
		t.Error("stage After's ConfigMap is not in the target")
	}
	if object(t, c, configMapGVK, ns, "after") != nil {
		t.Error("stage After's ConfigMap reached the source")
	}
}

// targetDaemon runs a second daemon in-process against the target, as
// the Capstan installed there would.
func targetDaemon(t *testing.T, tenv *testenv.Env) {
	t.Helper()
	opts := reconciler.DefaultOptions()
	opts.Config = tenv.Config
	opts.MetricsAddr, opts.HealthAddr = "0", "0"
	opts.LeaderElection.Enabled = false
	d, err := reconciler.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/sim"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/stages"
	"github.com/capstan-dev/capstan/stages/pivot"
)

// bootstrapCluster is the example's cluster, deployment and namespaces
// as one test runs them: the deployment in the test's namespace, the
// cluster and the bootstrap's providers in namespaces of their own, named
// after it so that they are the test's alone in the shared control plane.
type bootstrapCluster struct {
	cd                      *capstanv1.ClusterDeployment
	ns, clusterNS, provNS   string
	targetNamespaces        []string // where the new cluster's workloads run
	bootstrap, target       client.Client
	bootstrapCfg, targetCfg *rest.Config
	kubeconfig              []byte // the target's, as the simulator writes it into central-kubeconfig
}

// exampleBootstrap commits examples/clusters/bootstrap and the bases it
// uses to a new repository, with the cluster's namespace and the
// bootstrap providers' moved to names of the test, and returns its
// ClusterDeployment reading that repository.
func exampleBootstrap(t *testing.T, ns string) *bootstrapCluster {
	t.Helper()
	b := &bootstrapCluster{ns: ns, clusterNS: ns + "-central", provNS: ns + "-providers",
		targetNamespaces: []string{"capi-system", "helm-system"}}
	files := map[string]string{}
	for _, dir := range []string{"bases/metal3-cluster", "bases/providers", "clusters/bootstrap"} {
		root := filepath.Join("..", "examples", dir)
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			content, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(filepath.Join("..", "examples"), path)
			if err != nil {
				return err
			}
			files[filepath.ToSlash(rel)] = string(content)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	rename := map[string][2]string{
		"clusters/bootstrap/overlay/cluster/kustomization.yaml":   {"namespace: central", "namespace: " + b.clusterNS},
		"clusters/bootstrap/overlay/cluster/namespace.yaml":       {"name: central", "name: " + b.clusterNS},
		"clusters/bootstrap/overlay/bootstrap/kustomization.yaml": {"namespace: bootstrap-providers", "namespace: " + b.provNS},
		"clusters/bootstrap/overlay/bootstrap/namespace.yaml":     {"name: bootstrap-providers", "name: " + b.provNS},
	}
	for file, r := range rename {
		if !strings.Contains(files[file], r[0]) {
			t.Fatalf("%s no longer says %q", file, r[0])
		}
		files[file] = strings.Replace(files[file], r[0], r[1], 1)
	}
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "the bootstrap example"); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("../examples/clusters/bootstrap/clusterdeployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cd := &capstanv1.ClusterDeployment{}
	if err := yaml.UnmarshalStrict(raw, cd); err != nil {
		t.Fatalf("examples/clusters/bootstrap/clusterdeployment.yaml: %v", err)
	}
	cd.Namespace = ns
	cd.Spec.Source = &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
		URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(t, newClient(t), ns)},
	}}
	// Its BMC and IAM credentials are encrypted for the demo key.
	createDemoKeySecret(t, newClient(t), ns)
	b.cd = cd
	return b
}

// startBootstrapTarget starts the control plane the bootstrap cluster
// builds: kube-controller-manager (its Deployments get ReplicaSets and
// Pods) and the CRDs the new cluster's Helm bundle would install, which
// the move needs served.
func startBootstrapTarget(t *testing.T) *testenv.Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	providers, err := testenv.ProviderCRDDirs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tenv, err := testenv.Start(ctx, testenv.Options{
		CRDDirs: append([]string{"../manifests/crds"}, providers...), ControllerManager: true, Progress: io.Discard,
	})
	if err != nil {
		t.Fatalf("start the target control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := tenv.Stop(); err != nil {
			t.Errorf("stop the target control plane: %v", err)
		}
	})
	return tenv
}

// runUntilCleanup runs a simulated component until the test ends.
func runUntilCleanup(t *testing.T, what string, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v", what, err)
		}
	})
}

// simulate plays on one cluster the providers (with the kubeconfig Secret
// pointing at the target), a kubelet for namespaces, and, if lcm, the LCM
// agents of the cluster's machines.
func (b *bootstrapCluster) simulate(t *testing.T, name string, cfg *rest.Config, namespaces []string, lcm bool) {
	t.Helper()
	opts := sim.TestOptions(b.clusterNS)
	opts.Kubeconfig = func(cluster types.NamespacedName) []byte {
		if cluster.Name != b.cd.Spec.Substitute["CLUSTER_NAME"] {
			return nil
		}
		return b.kubeconfig
	}
	s, err := sim.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, name+" simulator", s.Run)
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	k := sim.NewKubelet(c, sim.KubeletOptions{Namespaces: namespaces, NodeName: "sim-" + name + "-" + b.ns})
	runUntilCleanup(t, name+" kubelet", k.Run)
	if lcm {
		opts := sim.DefaultLCMOptions()
		opts.Namespace = b.clusterNS
		runUntilCleanup(t, name+" LCM agents", sim.NewLCMAgent(c, opts).Run)
	}
}

// The bootstrap profile end to end, through a real pivot: a bootstrap
// control plane and a target one, the simulated providers on both, the
// Capstan of the bootstrap walking stages 1-10 (6-8 acting on the target
// through the kubeconfig Secret the simulated KubeadmControlPlane writes),
// the move, and the Capstan of the target, a second daemon started from
// the beginning, finishing 11-16. In the end every stage is Ready in the
// target, which holds every moved object once; the bootstrap keeps only
// the mirrors and nothing bootstrap-only; the target never ran the stages
// before the pivot again.
func TestBootstrapProfileFullFlow(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second control plane")
	}
	begin := time.Now()
	tenv := startBootstrapTarget(t)
	t.Logf("target control plane started in %s", time.Since(begin).Round(time.Millisecond))
	ns := newNamespace(t)
	b := exampleBootstrap(t, ns)
	b.bootstrap, b.bootstrapCfg, b.targetCfg = newClient(t), env.Config, tenv.Config
	tc, err := client.New(tenv.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	b.target = tc
	if b.kubeconfig, err = os.ReadFile(tenv.KubeconfigPath); err != nil {
		t.Fatal(err)
	}
	name := b.cd.Name

	b.simulate(t, "bootstrap", env.Config, []string{b.provNS}, false)
	b.simulate(t, "target", tenv.Config, b.targetNamespaces, true)
	bootOrder := watchStagesOn(t, env.Config, ns, name)
	targetOrder := watchStagesOn(t, tenv.Config, ns, name)
	startDaemonWith(t, nil, func(o *reconciler.Options) {
		o.ClusterName = "bootstrap"
		o.Reconciler.MirrorInterval = time.Second
	})
	// The target's Capstan runs from the start: it must not act before the
	// deployment arrives there, unsuspended.
	targetWrites := &requestCounter{}
	startDaemonWith(t, nil, func(o *reconciler.Options) { o.Config, o.ClusterName = targetWrites.wrap(tenv.Config), "central" })
	if err := b.bootstrap.Create(context.Background(), b.cd); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	moves := followPivot(t, b.bootstrap, ns, name, created)

	// Stages 1-8 in the bootstrap, 6-8 acting on the target.
	cd := waitDeployment(t, b.bootstrap, ns, name, "stages 1-8 Ready", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "HelmBundleReady").State == capstanv1.StageReady
	})
	t.Logf("bootstrap: stages 1-8 Ready %s after create (%s)", time.Since(created).Round(time.Millisecond), stageDurations(cd))
	b.assertAppliedIntoTarget(t)
	// The key the machines got, which must go with the deployment.
	key := &corev1.Secret{}
	if err := b.bootstrap.Get(context.Background(), client.ObjectKey{Namespace: b.ns, Name: stages.BootstrapKeySecret}, key); err != nil {
		t.Fatalf("the bootstrap key: %v", err)
	}
	public := strings.TrimSpace(string(key.Data["ssh-publickey"]))
	if w := targetWrites.snapshot(); len(w) != 0 {
		t.Errorf("the target's Capstan wrote before the deployment arrived: %v", w)
	}
	if got := listDeployments(t, b.target, ns); len(got) != 0 {
		t.Errorf("the target holds ClusterDeployments %v before the move", got)
	}

	cd = waitDeployment(t, b.bootstrap, ns, name, "the move done (status.pivot past CleanSource)", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Pivot != nil && slices.Contains([]capstanv1.PivotPhase{
			capstanv1.PivotSourceCleaned, capstanv1.PivotInstalled, capstanv1.PivotHandedOver, capstanv1.PivotCleanedUp,
		}, cd.Status.Pivot.Phase)
	})
	t.Logf("bootstrap: moved %d objects into %s %s after create; PivotDone: %s", cd.Status.Pivot.Objects, cd.Status.Pivot.Target,
		time.Since(created).Round(time.Millisecond), stage(cd, "PivotDone").Message)

	done := waitDeployment(t, b.target, ns, name, "every stage Ready in the target", isReady)
	t.Logf("target: Ready %s after create (%s)", time.Since(created).Round(time.Millisecond), stageDurations(done))
	// Not fatal: what the bootstrap holds says more about a handover that
	// did not finish than the timeout alone.
	mirror := waitOrReport(t, b.bootstrap, ns, name, "PivotDone Ready in the bootstrap (handed over, cleaned up)", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "PivotDone").State == capstanv1.StageReady && cd.Status.Pivot != nil && cd.Status.Pivot.Phase == capstanv1.PivotCleanedUp
	})
	moves.stop()
	t.Logf("bootstrap: %s", stageDurations(mirror))

	for _, st := range done.Status.Stages {
		if st.State != capstanv1.StageReady {
			t.Errorf("target: stage %s is %s: %s", st.Name, st.State, st.Message)
		}
	}
	if done.Status.Pivot == nil || done.Status.Pivot.Owner == "" || done.Status.Pivot.Owner != mirror.Status.Pivot.Owner {
		t.Errorf("target: status.pivot %+v; want it owned by the target's Capstan, as the bootstrap recorded (%+v)", done.Status.Pivot, mirror.Status.Pivot)
	}
	if !mirror.Spec.Suspend || mirror.Annotations[pivot.MirrorAnnotation] == "" {
		t.Errorf("bootstrap: the deployment is not a suspended mirror (suspend %t, annotations %v)", mirror.Spec.Suspend, mirror.Annotations)
	}
	assertStageOrder(t, "bootstrap", bootOrder, profileStages(t)[:10])
	assertStageOrder(t, "target", targetOrder, profileStages(t))
	b.assertMirrorsFollow(t, mirror)
	b.assertNotWalkedAgain(t, mirror, done)
	b.assertMovedOnce(t, mirror)
	b.assertOnlyMirrorsLeft(t)
	b.assertBootstrapKeyMoved(t, public)
	b.assertHelmControllerEnabled(t)
	b.dayTwo(t)
}

// dayTwo commits a new revision after the move: the target's Capstan walks
// it in the new cluster alone, every stage of the profile, without the
// bootstrap-only objects (the bootstrap's providers are not installed
// there, and the stages that only served them pass empty), and the
// bootstrap's mirror shows it.
func (b *bootstrapCluster) dayTwo(t *testing.T) {
	t.Helper()
	const file = "clusters/bootstrap/overlay/target/helm-controller.yaml"
	raw, err := os.ReadFile(filepath.Join("..", "examples", file))
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(string(raw), "  kubeconfig: in-cluster\n", "  kubeconfig: in-cluster\n  logLevel: debug\n", 1)
	if changed == string(raw) {
		t.Fatalf("%s no longer says kubeconfig: in-cluster", file)
	}
	sha, err := gitSrv.Commit(b.ns, gitserver.DefaultBranch, map[string]string{file: changed}, "day 2: the helm-controller logs more")
	if err != nil {
		t.Fatal(err)
	}
	there := getDeployment(t, b.target, b.ns, b.cd.Name)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, reconciler.ReconcileRequestedAnnotation, time.Now().Format(time.RFC3339Nano))
	if err := b.target.Patch(context.Background(), there, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	pushed := time.Now()
	done := waitDeployment(t, b.target, b.ns, b.cd.Name, "Ready at the day-2 revision in the target", func(cd *capstanv1.ClusterDeployment) bool {
		return isReady(cd) && strings.HasSuffix(cd.Status.Revision, sha)
	})
	t.Logf("target: day-2 revision Ready %s after the reconcile request (%s)", time.Since(pushed).Round(time.Millisecond), stageDurations(done))
	cm := object(t, b.target, corev1.SchemeGroupVersion.WithKind("ConfigMap"), "helm-system", "helm-controller-config")
	if cm == nil {
		t.Fatal("helm-controller-config is not in the target")
	}
	if v, _, _ := unstructured.NestedString(cm.Object, "data", "logLevel"); v != "debug" {
		t.Errorf("the target's helm-controller-config has logLevel %q after the day-2 revision, want debug", v)
	}
	b.assertHelmControllerEnabled(t)
	if ns := object(t, b.target, corev1.SchemeGroupVersion.WithKind("Namespace"), "", b.provNS); ns != nil {
		t.Errorf("the day-2 walk put the bootstrap's providers' namespace %s into the target", b.provNS)
	}
	if object(t, b.bootstrap, corev1.SchemeGroupVersion.WithKind("ConfigMap"), "helm-system", "helm-controller-config") != nil {
		t.Error("the day-2 walk put the new cluster's helm-controller-config into the bootstrap cluster")
	}
	// The mirror shows the target's walk, and acts on nothing.
	waitDeployment(t, b.bootstrap, b.ns, b.cd.Name, "the bootstrap's mirror showing the day-2 revision, suspended", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Spec.Suspend && cd.Status.Revision == done.Status.Revision
	})
}

// assertHelmControllerEnabled: HelmControllerDisabledBeforeConfig scaled
// the new cluster's helm-controller to 0 and HelmControllerEnabledAfterConfig
// gave it back the count the example commits, 1.
func (b *bootstrapCluster) assertHelmControllerEnabled(t *testing.T) {
	t.Helper()
	hc := object(t, b.target, appsv1.SchemeGroupVersion.WithKind("Deployment"), "helm-system", "helm-controller")
	if hc == nil {
		t.Fatal("the helm-controller is not in the target")
	}
	if n, _, _ := unstructured.NestedInt64(hc.Object, "spec", "replicas"); n != 1 {
		t.Errorf("the target's helm-controller has spec.replicas %d after the walk, want the committed 1", n)
	}
}

// waitOrReport is waitDeployment that reports a timeout as an error and
// returns the deployment as it last was, so that the test can say what
// else is wrong.
func waitOrReport(t *testing.T, c client.Client, ns, name, what string, cond func(*capstanv1.ClusterDeployment) bool) *capstanv1.ClusterDeployment {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	cd := &capstanv1.ClusterDeployment{}
	for {
		err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, cd)
		if err == nil && cond(cd) {
			return cd
		}
		if time.Now().After(deadline) {
			t.Errorf("timed out after %s waiting for ClusterDeployment %s/%s: %s (last error: %v; status: %s)", waitTimeout, ns, name, what, err, describe(cd))
			return cd
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pivotLog logs every change of a deployment's status.pivot, with the
// time since start, until stopped or the test ends.
type pivotLog struct{ stop func() }

func followPivot(t *testing.T, c client.Client, ns, name string, start time.Time) *pivotLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := ""
		for ctx.Err() == nil {
			cd := &capstanv1.ClusterDeployment{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cd); err == nil {
				now := fmt.Sprintf("stage PivotDone %s %q", stage(cd, "PivotDone").State, stage(cd, "PivotDone").Message)
				if p := cd.Status.Pivot; p != nil {
					now += fmt.Sprintf("; status.pivot phase %q, %d objects, owner %q: %s", p.Phase, p.Objects, p.Owner, p.Message)
				}
				if now != last {
					t.Logf("bootstrap at %s: %s", time.Since(start).Round(100*time.Millisecond), now)
					last = now
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	l := &pivotLog{stop: func() { cancel(); <-done }}
	t.Cleanup(l.stop)
	return l
}

// profileStages are the bootstrap profile's stage names in order.
func profileStages(t *testing.T) []string {
	t.Helper()
	p, err := stages.LoadProfile("bootstrap")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range p.Stages {
		names = append(names, s.Name)
	}
	return names
}

func listDeployments(t *testing.T, c client.Client, ns string) []string {
	t.Helper()
	list := &capstanv1.ClusterDeploymentList{}
	if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, cd := range list.Items {
		names = append(names, cd.Name)
	}
	return names
}

// watchStagesOn records, from a watch on the deployment in the cluster of
// cfg, the order its stages became Ready and any stage that started
// before the one ahead of it was Ready.
func watchStagesOn(t *testing.T, cfg *rest.Config, ns, name string) *stageWatch {
	t.Helper()
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sw := &stageWatch{}
	go func() {
		// The deployment may not exist there yet: follow the namespace,
		// again after every end of the watch, until the test ends.
		for ctx.Err() == nil {
			w, err := c.Watch(ctx, &capstanv1.ClusterDeploymentList{}, client.InNamespace(ns))
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
				continue
			}
			for ev := range w.ResultChan() {
				if cd, ok := ev.Object.(*capstanv1.ClusterDeployment); ok && cd.Name == name {
					sw.observe(cd)
				}
			}
			w.Stop()
		}
	}()
	return sw
}

func assertStageOrder(t *testing.T, where string, sw *stageWatch, want []string) {
	t.Helper()
	// The watch may lag the poll that saw the last stage Ready: give it
	// until a deadline to have seen as many, then judge what it saw.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		sw.mu.Lock()
		seen := len(sw.readyOrder)
		sw.mu.Unlock()
		if seen >= len(want) {
			break
		}
	}
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if !slices.Equal(sw.readyOrder, want) {
		t.Errorf("%s: stages became Ready in the order %v, want %v", where, sw.readyOrder, want)
	}
	for _, v := range sw.violations {
		t.Errorf("%s: stage order broken: %s", where, v)
	}
}

// assertAppliedIntoTarget: stages 6-8 applied the new cluster's
// namespaces, settings and Helm bundle there, with Capstan's labels, and
// none of it into the bootstrap cluster.
func (b *bootstrapCluster) assertAppliedIntoTarget(t *testing.T) {
	t.Helper()
	for _, o := range []struct{ kind, ns, name string }{
		{"Namespace", "", "capi-system"}, {"Secret", "iam", "iam-admin"}, {"ConfigMap", "capi-system", "provider-settings"},
		{"Deployment", "capi-system", "capi-controller-manager"}, {"Deployment", "helm-system", "helm-controller"},
	} {
		gvk := corev1.SchemeGroupVersion.WithKind(o.kind)
		if o.kind == "Deployment" {
			gvk.Group = "apps"
		}
		there := object(t, b.target, gvk, o.ns, o.name)
		if there == nil {
			t.Errorf("%s %s/%s is not in the target after HelmBundleReady", o.kind, o.ns, o.name)
		} else if there.GetLabels()[stages.OwnerGroup+"/name"] != b.cd.Name {
			t.Errorf("%s %s/%s in the target lacks Capstan's labels: %v", o.kind, o.ns, o.name, there.GetLabels())
		}
		if object(t, b.bootstrap, gvk, o.ns, o.name) != nil {
			t.Errorf("%s %s/%s, the new cluster's, is in the bootstrap cluster", o.kind, o.ns, o.name)
		}
	}
}

// assertNotWalkedAgain: the target's Capstan took the stages before the
// pivot as the bootstrap left them, and ran none of them again.
// assertMirrorsFollow waits until the bootstrap's Cluster and Machines
// carry the status of theirs in the target, as the mirror refresh copies
// it, and the mirror deployment the target's stages.
func (b *bootstrapCluster) assertMirrorsFollow(t *testing.T, mirror *capstanv1.ClusterDeployment) {
	t.Helper()
	refs := mirror.Status.Pivot.Mirrors
	kinds := map[string]int{}
	for _, r := range refs {
		kinds[r.Kind]++
	}
	if kinds["Cluster"] != 1 || kinds["Machine"] == 0 {
		t.Errorf("status.pivot.mirrors = %v; want the Cluster and its Machines", refs)
	}
	ctx := context.Background()
	differ := ""
	waitFor(t, "the mirrors to carry the target's status", func() (bool, error) {
		for _, r := range refs {
			here, there := &unstructured.Unstructured{}, &unstructured.Unstructured{}
			for _, u := range []*unstructured.Unstructured{here, there} {
				u.SetAPIVersion(r.APIVersion)
				u.SetKind(r.Kind)
			}
			if err := b.bootstrap.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: r.Name}, here); err != nil {
				return false, err
			}
			if err := b.target.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: r.Name}, there); err != nil {
				return false, err
			}
			// The simulated Cluster API in the bootstrap still runs and marks
			// the paused mirrors Paused, as the real one would if it had not
			// been scaled down: that one condition is the bootstrap's own.
			if !equality.Semantic.DeepEqual(withoutPaused(here), withoutPaused(there)) {
				differ = r.Kind + " " + r.Name
				return false, fmt.Errorf("%s differs", differ)
			}
		}
		cd := &capstanv1.ClusterDeployment{}
		if err := b.bootstrap.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: b.cd.Name}, cd); err != nil {
			return false, err
		}
		return stage(cd, "ClusterReady").State == capstanv1.StageReady && cd.Status.Pivot.MirroredAt != nil, nil
	})
}

// withoutPaused is u's status without its Paused condition.
// withoutPaused is u's status without what the bootstrap's own simulated
// Cluster API writes on a paused mirror right after each refresh: the
// Paused condition and the observedGeneration it comes with.
func withoutPaused(u *unstructured.Unstructured) any {
	status, _ := u.Object["status"].(map[string]any)
	status = maps.Clone(status)
	delete(status, "observedGeneration")
	if conds, ok := status["conditions"].([]any); ok {
		status["conditions"] = slices.DeleteFunc(slices.Clone(conds), func(c any) bool {
			m, _ := c.(map[string]any)
			return m["type"] == "Paused"
		})
	}
	return status
}

func (b *bootstrapCluster) assertNotWalkedAgain(t *testing.T, mirror, done *capstanv1.ClusterDeployment) {
	t.Helper()
	for _, name := range profileStages(t)[:9] {
		here, there := stage(mirror, name), stage(done, name)
		if there.Attempts != here.Attempts || !there.FinishedAt.Equal(here.FinishedAt) {
			t.Errorf("stage %s: %d attempts, finished %v in the target; %d, finished %v in the bootstrap: the target ran it again",
				name, there.Attempts, there.FinishedAt, here.Attempts, here.FinishedAt)
		}
	}
}

// isMirror reports whether the bootstrap keeps o after the move.
func (b *bootstrapCluster) isMirror(o pivot.Object) bool {
	cluster := b.cd.Spec.Substitute["CLUSTER_NAME"]
	switch {
	case o.Kind == "ClusterDeployment":
		return true
	case o.Kind == "Cluster" || o.Kind == "Machine":
		return strings.HasPrefix(o.APIVersion, "cluster.x-k8s.io/")
	case o.Kind == "Secret":
		// The target's kubeconfig, to mirror through. (The bootstrap key
		// and the source's credentials are held until the cleanup only.)
		return o.Namespace == b.clusterNS && o.Name == sim.KubeconfigSecretName(cluster)
	}
	return false
}

// assertMovedOnce: what moved, the graph of the deployment as the target
// holds it less what stages 6-8 and 14 applied there, is as many objects
// as the move recorded, each in the target and, but for the mirrors, no
// longer in the bootstrap.
func (b *bootstrapCluster) assertMovedOnce(t *testing.T, mirror *capstanv1.ClusterDeployment) {
	t.Helper()
	ctx := context.Background()
	all, roots, err := pivot.Discover(ctx, b.target, discovery.NewDiscoveryClientForConfigOrDie(b.targetCfg), b.ns, b.cd.Name)
	if err != nil {
		t.Fatal(err)
	}
	appliedThere := map[string]bool{"ObjectsCreated": true, "ProviderConfigured": true, "HelmBundleReady": true, "HelmControllerConfigUpdated": true}
	var movedRoots []pivot.Object
	for _, r := range roots {
		u := find(all, r)
		if u == nil || !appliedThere[u.GetLabels()[stages.StageKey]] {
			movedRoots = append(movedRoots, r)
		}
	}
	g, err := pivot.BuildGraph(all, movedRoots)
	if err != nil {
		t.Fatal(err)
	}
	if mirror.Status.Pivot == nil || int(mirror.Status.Pivot.Objects) != g.Len() {
		t.Errorf("the target holds %d objects of the move; the bootstrap recorded %+v", g.Len(), mirror.Status.Pivot)
	}
	var kept []string
	for _, n := range g.Nodes() {
		id := n.ID()
		if n.Object.GetLabels()["capstan.dev/bootstrap-only"] == "true" {
			t.Errorf("%s, bootstrap-only, moved into the target", id)
		}
		left := &unstructured.Unstructured{}
		left.SetGroupVersionKind(n.Object.GroupVersionKind())
		err := b.bootstrap.Get(ctx, client.ObjectKey{Namespace: id.Namespace, Name: id.Name}, left)
		switch {
		case err == nil && b.isMirror(id):
			kept = append(kept, id.String())
			if left.GetAnnotations()[pivot.MirrorAnnotation] == "" {
				t.Errorf("the mirror %s in the bootstrap is not annotated %s", id, pivot.MirrorAnnotation)
			}
		case err == nil:
			t.Errorf("%s moved, and is still in the bootstrap", id)
		case !apierrors.IsNotFound(err):
			t.Errorf("%s in the bootstrap: %v", id, err)
		case b.isMirror(id):
			t.Errorf("%s moved, and its mirror is not in the bootstrap", id)
		}
	}
	slices.Sort(kept)
	t.Logf("moved %d objects; mirrors kept in the bootstrap: %s", g.Len(), strings.Join(kept, ", "))
}

func find(all []*unstructured.Unstructured, o pivot.Object) *unstructured.Unstructured {
	for _, u := range all {
		if pivot.ObjectOf(u) == o {
			return u
		}
	}
	return nil
}

// assertOnlyMirrorsLeft: of everything that can move, the bootstrap
// keeps in the deployment's namespaces only the mirrors, Capstan's own
// bootstrap key and what Kubernetes puts in every namespace; the
// bootstrap providers are gone, and never reached the target.
func (b *bootstrapCluster) assertOnlyMirrorsLeft(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	left, err := pivot.List(ctx, b.bootstrap, discovery.NewDiscoveryClientForConfigOrDie(b.bootstrapCfg), []string{b.ns, b.clusterNS, b.provNS})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range left {
		id := pivot.ObjectOf(u)
		switch {
		case b.isMirror(id):
		case id.Kind == "ConfigMap" && id.Name == "kube-root-ca.crt":
		case id.Kind == "Secret" && id.Namespace == b.ns && id.Name == stages.BootstrapKeySecret:
		default:
			t.Errorf("the bootstrap still holds %s", id)
		}
	}
	for _, c := range []struct {
		where string
		c     client.Client
	}{{"bootstrap", b.bootstrap}, {"target", b.target}} {
		nsObj := &corev1.Namespace{}
		err := c.c.Get(ctx, client.ObjectKey{Name: b.provNS}, nsObj)
		if err == nil && nsObj.DeletionTimestamp == nil {
			t.Errorf("%s: namespace %s of the bootstrap providers is there", c.where, b.provNS)
		}
		deployments := &appsv1.DeploymentList{}
		if err := c.c.List(ctx, deployments, client.MatchingLabels{"capstan.dev/bootstrap-only": "true"}); err != nil {
			t.Fatal(err)
		}
		for _, d := range deployments.Items {
			if d.DeletionTimestamp == nil {
				t.Errorf("%s: Deployment %s/%s, bootstrap-only, is there", c.where, d.Namespace, d.Name)
			}
		}
	}
}

// assertBootstrapKeyMoved: the new cluster goes on with the bootstrap key
// its machines got: its copy bootstrap-key-<cluster>, its network plan and
// the key its Capstan renders with are the key the bootstrap generated.
func (b *bootstrapCluster) assertBootstrapKeyMoved(t *testing.T, public string) {
	t.Helper()
	ctx := context.Background()
	// The bootstrap's copy, held for its walk until the handover, is gone.
	if err := b.bootstrap.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: stages.BootstrapKeySecret}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("the bootstrap key is still in the bootstrap after the cleanup (%v)", err)
	}
	cluster := b.cd.Spec.Substitute["CLUSTER_NAME"]
	network := object(t, b.target, configMapGVK, b.clusterNS, cluster+"-network")
	if network == nil {
		t.Fatalf("the network ConfigMap did not move")
	}
	if keys, _, _ := unstructured.NestedString(network.Object, "data", "sshAuthorizedKeys"); !strings.Contains(keys, public) {
		t.Errorf("the target's network plan lacks the bootstrap key %q:\n%s", public, keys)
	}
	// The Capstan there renders with the key of the deployment's namespace
	// there: it must be this one, or its next apply of the network plan
	// and of bootstrap-key-<cluster> hands the machines a key nobody holds.
	there := &corev1.Secret{}
	if err := b.target.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: stages.BootstrapKeySecret}, there); err != nil ||
		strings.TrimSpace(string(there.Data["ssh-publickey"])) != public {
		t.Errorf("the target's %s: %v, public key %q; want the bootstrap's %q, moved with the deployment", stages.BootstrapKeySecret, err,
			strings.TrimSpace(string(there.Data["ssh-publickey"])), public)
	}
	copied := &corev1.Secret{}
	err := b.target.Get(ctx, client.ObjectKey{Namespace: b.ns, Name: stages.BootstrapKeyCopyPrefix + b.cd.Name}, copied)
	if err != nil || strings.TrimSpace(string(copied.Data["ssh-publickey"])) != public {
		t.Errorf("the target's %s%s: %v, public key %q; want the bootstrap's %q", stages.BootstrapKeyCopyPrefix, b.cd.Name, err,
			strings.TrimSpace(string(copied.Data["ssh-publickey"])), public)
	}
}

// `capstan dev --scenario bootstrap --exit-when-ready`, as a user runs
// it: two control planes, the bootstrap's Capstan, and the target's as a
// second daemon in the process, saying so; it exits 0 once every stage is
// Ready in the target and the bootstrap's PivotDone is Ready, having
// printed the stages before the pivot becoming ready in the bootstrap and
// the others in the target, in order, then the stage table and the
// mirrors the bootstrap keeps.
func TestDevBootstrapScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two control planes")
	}
	bin := capstanBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	begin := time.Now()
	dev := exec.CommandContext(ctx, bin, "dev", "--scenario", "bootstrap", "--exit-when-ready", "--timeout", "3m", "--sim-speed", "10")
	dev.Dir = ".."
	out, err := dev.CombinedOutput()
	if err != nil {
		t.Fatalf("capstan dev --scenario bootstrap: %v\n%s", err, out)
	}
	t.Logf("capstan dev --scenario bootstrap --exit-when-ready --sim-speed 10: exit 0 after %s", time.Since(begin).Round(100*time.Millisecond))

	// Stages 1-9 become ready in the bootstrap, 11-15 after them in the
	// target; PivotDone in both: taken over there, handed over here.
	text := string(out)
	at := 0
	names := profileStages(t)
	pivotAt := slices.Index(names, "PivotDone")
	for i, s := range names {
		where := "bootstrap"
		switch {
		case i == pivotAt:
			continue
		case i > pivotAt:
			where = "target"
		}
		j := strings.Index(text[at:], "✓ "+where+" "+s+" ")
		if j < 0 {
			t.Fatalf("output does not show %s becoming ready in the %s cluster after the stages before it:\n%s", s, where, out)
		}
		at += j
		if i == pivotAt-1 {
			for _, where := range []string{"bootstrap", "target"} {
				if !strings.Contains(text[at:], "✓ "+where+" PivotDone ") {
					t.Errorf("output does not show PivotDone ready in the %s cluster after %s:\n%s", where, s, out)
				}
			}
		}
	}
	for _, want := range []string{
		"target Capstan: a second daemon in this process (no node to run a pod here)",
		"CENTRAL STAGE", "DURATION", "bootstrap -> target", "MIRRORS IN THE BOOTSTRAP CLUSTER",
		"ClusterDeployment capstan-system/central", "Cluster central/central", "Secret central/central-kubeconfig",
		"central Ready in the target cluster",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/reconciler/report"
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
	p := newPivotSetup(ctx, t, true)
	tenv, tc, c, ns := p.tenv, p.tc, p.c, p.ns
	startDaemon(t, nil)
	// A neighbour that shares the git credentials, suspended: they must
	// stay here for it.
	createDeployment(t, c, ns, "neighbour", capstanv1.ClusterDeploymentSpec{
		Suspend: true,
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: p.url, Ref: capstanv1.GitRef{Branch: "main"}, SecretRef: &capstanv1.LocalObjectReference{Name: "git-auth"},
		}},
		Path: "clusters/pivot",
	})
	// Its status commits push with credentials of their own, which the
	// Capstan of the target needs as much as the source's.
	push := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "status-push", Namespace: ns},
		StringData: map[string]string{"username": "capstan", "password": "s3cret-token"}}
	if err := c.Create(ctx, push); err != nil {
		t.Fatal(err)
	}
	p.createMovableWith(t, func(spec *capstanv1.ClusterDeploymentSpec) {
		spec.Report = &capstanv1.ReportSpec{GitStatus: &capstanv1.GitStatusReport{
			Interval: &metav1.Duration{Duration: time.Second}, SecretRef: &capstanv1.LocalObjectReference{Name: push.Name}}}
	})

	// The move is done once it waits for the target's Capstan: there is
	// none yet, and this daemon does not know an image to install.
	// (The stage's message follows the record within the attempt.)
	cd := waitDeployment(t, c, ns, "movable", "the move done, the stage waiting for the target's Capstan", func(cd *capstanv1.ClusterDeployment) bool {
		st := stage(cd, "Pivot")
		return cd.Status.Pivot != nil && cd.Status.Pivot.Phase == capstanv1.PivotInstalled &&
			st.State == capstanv1.StageInProgress && strings.Contains(st.Message, "waiting for the Capstan of Secret "+ns+"/target-kubeconfig to take the deployment over")
	})
	if !cd.Spec.Suspend || cd.Annotations[pivot.MirrorAnnotation] == "" {
		t.Errorf("the deployment here: suspend %t, annotations %v; want a suspended mirror", cd.Spec.Suspend, cd.Annotations)
	}
	if p := cd.Status.Pivot; p.Objects == 0 || p.KubeConfig == nil || p.KubeConfig.Name != "target-kubeconfig" || p.Owner == "" {
		t.Errorf("status.pivot = %+v; want the objects moved, the target's kubeconfig and its owner", p)
	}

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
	if there.Status.Pivot != nil {
		t.Errorf("the deployment arrived with the source's record of the move: %+v", there.Status.Pivot)
	}
	for _, name := range []string{"target-kubeconfig", cd.Spec.Source.Git.SecretRef.Name, push.Name} {
		if err := tc.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &corev1.Secret{}); err != nil {
			t.Errorf("Secret %s, which the deployment names, did not move: %v", name, err)
		}
	}
	// Both fencing records name the target's Capstan.
	targetID, err := pivot.ClusterID(context.Background(), tc)
	if err != nil {
		t.Fatal(err)
	}
	for side, cl := range map[string]client.Client{"source": c, "target": tc} {
		if holder, err := pivot.FenceHolder(context.Background(), cl, ns, "movable"); err != nil || holder != targetID {
			t.Errorf("fencing record in the %s: holder %q, %v; want the target's %q", side, holder, err, targetID)
		}
	}

	// The Capstan of the target takes the deployment over and goes on;
	// the source's sees it, completes its pivot stage and stops.
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
	if done.Status.Pivot == nil || done.Status.Pivot.Owner != targetID {
		t.Errorf("the target's status.pivot = %+v; want it owned by the target (%s)", done.Status.Pivot, targetID)
	}
	if object(t, tc, configMapGVK, ns, "after") == nil {
		t.Error("stage After's ConfigMap is not in the target")
	}
	if object(t, c, configMapGVK, ns, "after") != nil {
		t.Error("stage After's ConfigMap reached the source")
	}
	mirror := waitDeployment(t, c, ns, "movable", "the handover confirmed and the mirror following the target", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Pivot != nil && cd.Status.Pivot.Phase == capstanv1.PivotCleanedUp && cd.Status.Pivot.MirroredAt != nil &&
			stage(cd, "After").State == capstanv1.StageReady && isReady(cd)
	})
	if mirror.Status.Pivot.Message != "" {
		t.Errorf("mirror: %s", mirror.Status.Pivot.Message)
	}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "target-kubeconfig"}, &corev1.Secret{}); err != nil {
		t.Errorf("the target's kubeconfig Secret left the source, which needs it to mirror: %v", err)
	}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "git-auth"}, &corev1.Secret{}); err != nil {
		t.Errorf("the git credentials, which deployment neighbour shares, left the source: %v", err)
	}
	// The target's Capstan commits the status of the walk it finished,
	// with the push credentials that moved; the source's copy goes.
	waitStatusFile(t, gitSrv, ns, ns, "movable", "the target's walk, stage After Ready", func(f *report.File) bool {
		return fileStage(f, "After").State == string(capstanv1.StageReady)
	})
	waitFor(t, "the source's copy of the status push credentials dropped", func() (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: push.Name}, &corev1.Secret{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

// After the handover the source's Capstan never writes for the
// deployment again: a restart keeps it a mirror, and even a mirror
// turned back into a deployment by hand, at a new revision, is fenced by
// the record the move handed to the target, while the target's Capstan
// applies that revision.
func TestPivotFencesTheSourceAfterTheHandover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := newPivotSetup(ctx, t, true)
	tenv, tc, c, ns := p.tenv, p.tc, p.c, p.ns
	source, _ := startDaemonWith(t, nil, func(o *reconciler.Options) { o.Reconciler.MirrorInterval = time.Second })
	targetDaemon(t, tenv)
	p.createMovable(t)
	waitDeployment(t, c, ns, "movable", "the handover confirmed", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Pivot != nil && cd.Status.Pivot.Phase == capstanv1.PivotCleanedUp
	})

	// A restarted source daemon stays a mirror and writes nothing for it.
	stopDaemon(source)
	_, counter := startDaemonWith(t, nil, func(o *reconciler.Options) { o.Reconciler.MirrorInterval = time.Second })
	// A mirror drops its copy of the credentials that moved, after the
	// handover is recorded or at the restarted daemon's first refresh.
	waitFor(t, "the mirror's copy of the git credentials dropped", func() (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "git-auth"}, &corev1.Secret{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})

	// A new revision, and the mirror turned back into a deployment by hand.
	files := pivotFiles(ns)
	files["clusters/pivot/config.yaml"] = strings.Replace(files["clusters/pivot/config.yaml"], `moved: "yes"`, `moved: "twice"`, 1)
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "a new revision"); err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"metadata":{"annotations":{"` + pivot.MirrorAnnotation + `":null}},"spec":{"suspend":false}}`)
	if err := c.Patch(ctx, &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "movable"}},
		client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	// The credentials moved, and the mirror dropped its copy: an operator
	// gives them back, once it is no mirror.
	gitSecret(t, c, ns)
	// Its first write is refused.
	fenced := func(cd *capstanv1.ClusterDeployment) string {
		for _, st := range cd.Status.Stages {
			if strings.Contains(st.Message, "is owned by the Capstan of") {
				return st.Message
			}
		}
		return ""
	}
	refused := waitDeployment(t, c, ns, "movable", "the source refusing to write, fenced", func(cd *capstanv1.ClusterDeployment) bool {
		return fenced(cd) != ""
	})
	if msg := fenced(refused); !strings.Contains(msg, "Lease "+ns+"/"+pivot.FenceName("movable")) || !strings.Contains(msg, targetIDOf(t, tc)) {
		t.Errorf("the fenced stage does not name the record and its holder: %q", msg)
	}
	// The target's Capstan applies the new revision there; the source
	// applied nothing anywhere.
	waitFor(t, "the target to apply the new revision", func() (bool, error) {
		cm := object(t, tc, configMapGVK, ns, "settings")
		return cm != nil && cm.Object["data"].(map[string]any)["moved"] == "twice", nil
	})
	if object(t, c, configMapGVK, ns, "settings") != nil {
		t.Error("the fenced source re-created ConfigMap settings")
	}
	if n := counter.total("PATCH /", "/configmaps/"); n != 0 {
		t.Errorf("the restarted source daemon applied ConfigMaps %d times; want none", n)
	}
}

// pivotSetup is what every test of the pivot stage starts from: a target
// control plane, with or without Capstan's CRDs, a repository holding
// pivotFiles, and the target's kubeconfig in Secret target-kubeconfig of
// the test's namespace.
type pivotSetup struct {
	tenv    *testenv.Env
	tc, c   client.Client // the target's and the source's
	ns, url string
}

func newPivotSetup(ctx context.Context, t *testing.T, crds bool) *pivotSetup {
	t.Helper()
	opts := testenv.Options{Progress: io.Discard}
	if crds {
		opts.CRDDirs = []string{"../manifests/crds"}
	}
	tenv, err := testenv.Start(ctx, opts)
	if err != nil {
		t.Fatalf("start the target control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := tenv.Stop(); err != nil {
			t.Errorf("stop the target: %v", err)
		}
	})
	p := &pivotSetup{tenv: tenv, c: newClient(t), ns: newNamespace(t)}
	if p.tc, err = client.New(tenv.Config, client.Options{Scheme: reconciler.Scheme()}); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := os.ReadFile(tenv.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	if p.url, err = gitSrv.CreateRepo(p.ns); err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(p.ns, gitserver.DefaultBranch, pivotFiles(p.ns), "a deployment that moves"); err != nil {
		t.Fatal(err)
	}
	writeKubeconfigSecret(t, p.c, p.ns, "target-kubeconfig", kubeconfig)
	return p
}

// createMovable creates ClusterDeployment movable: stage Config here,
// Pivot into the target, After there.
func (p *pivotSetup) createMovable(t *testing.T) {
	t.Helper()
	p.createMovableWith(t, func(*capstanv1.ClusterDeploymentSpec) {})
}

// createMovableWith is createMovable with the spec changed by change.
func (p *pivotSetup) createMovableWith(t *testing.T, change func(*capstanv1.ClusterDeploymentSpec)) {
	t.Helper()
	spec := capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: p.url, Ref: capstanv1.GitRef{Branch: "main"}, SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(t, p.c, p.ns)},
		}},
		Path: "clusters/pivot",
		Stages: []capstanv1.StageSpec{
			{Name: "Config"},
			{Name: "Pivot", Action: capstanv1.StageActionPivot, KubeConfig: kubeconfigRef("target-kubeconfig")},
			{Name: "After"},
		},
	}
	change(&spec)
	createDeployment(t, p.c, p.ns, "movable", spec)
}

func targetIDOf(t *testing.T, c client.Client) string {
	t.Helper()
	id, err := pivot.ClusterID(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	return id
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

// A move survives its daemon stopping at every phase: each time
// status.pivot records a new phase, the source's daemon is stopped (its
// requests cancelled wherever they are) and a new one started, which
// resumes after the phase recorded. The end state is that of an
// uninterrupted move: everything moved once, the target's Capstan owns
// and finishes the deployment, the source keeps its mirror, and nothing
// stays suspended in the target.
func TestPivotStageResumesAfterARestartAtEveryPhase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := newPivotSetup(ctx, t, true)
	tenv, tc, c, ns := p.tenv, p.tc, p.c, p.ns
	tune := func(o *reconciler.Options) { o.Reconciler.MirrorInterval = time.Second }
	source, _ := startDaemonWith(t, nil, tune)
	targetDaemon(t, tenv)
	p.createMovable(t)

	var restartedAt []capstanv1.PivotPhase
	deadline := time.Now().Add(waitTimeout)
	for {
		cd := getDeployment(t, c, ns, "movable")
		phase := capstanv1.PivotPhase("")
		if cd.Status.Pivot != nil {
			phase = cd.Status.Pivot.Phase
		}
		if phase == capstanv1.PivotCleanedUp {
			break
		}
		if phase != "" && !slices.Contains(restartedAt, phase) {
			restartedAt = append(restartedAt, phase)
			stopDaemon(source)
			source, _ = startDaemonWith(t, nil, tune)
		}
		if time.Now().After(deadline) {
			there := &capstanv1.ClusterDeployment{}
			err := tc.Get(ctx, client.ObjectKey{Namespace: ns, Name: "movable"}, there)
			t.Fatalf("the move did not finish in %s; restarted after %v; status.pivot %+v; stage Pivot %+v; in the target (%v): %s, status.pivot %+v",
				waitTimeout, restartedAt, cd.Status.Pivot, stage(cd, "Pivot"), err, describe(there), there.Status.Pivot)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("restarted the source's daemon after phases %v", restartedAt)
	if len(restartedAt) < 4 {
		t.Errorf("restarted after %d phases only (%v): the test did not interrupt the move", len(restartedAt), restartedAt)
	}

	done := &capstanv1.ClusterDeployment{}
	waitFor(t, "the target's Capstan to finish the deployment", func() (bool, error) {
		if err := tc.Get(ctx, client.ObjectKey{Namespace: ns, Name: "movable"}, done); err != nil {
			return false, err
		}
		return isReady(done), nil
	})
	if done.Spec.Suspend {
		t.Error("the deployment in the target stayed suspended")
	}
	for _, name := range []string{"settings", "after"} {
		if object(t, tc, configMapGVK, ns, name) == nil {
			t.Errorf("ConfigMap %s is not in the target", name)
		}
		if object(t, c, configMapGVK, ns, name) != nil {
			t.Errorf("ConfigMap %s is in the source", name)
		}
	}
	// The mirror follows the target's status every MirrorInterval: a
	// source daemon restarted late in the move may leave the pivot stage
	// to the first refresh.
	waitFor(t, "the source's deployment a suspended mirror with its pivot done", func() (bool, error) {
		mirror := getDeployment(t, c, ns, "movable")
		if !mirror.Spec.Suspend || mirror.Annotations[pivot.MirrorAnnotation] == "" || stage(mirror, "Pivot").State != capstanv1.StageReady {
			return false, fmt.Errorf("suspend %t, annotations %v, Pivot %s", mirror.Spec.Suspend, mirror.Annotations, stage(mirror, "Pivot").State)
		}
		return true, nil
	})
	targetID := targetIDOf(t, tc)
	for side, cl := range map[string]client.Client{"source": c, "target": tc} {
		if holder, err := pivot.FenceHolder(ctx, cl, ns, "movable"); err != nil || holder != targetID {
			t.Errorf("fencing record in the %s: holder %q, %v; want the target's", side, holder, err)
		}
	}
}

// A move whose preflight fails changes nothing, in either cluster: the
// stage stalls naming what the target lacks, in its message and in
// status.pivot, and the deployment here is neither paused nor moved.
func TestPivotStagePreflightStallsAndChangesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := newPivotSetup(ctx, t, false)
	tc, c, ns := p.tc, p.c, p.ns
	startDaemon(t, nil)
	p.createMovable(t)
	cd := waitDeployment(t, c, ns, "movable", "the pivot stage stalled by its preflight", func(cd *capstanv1.ClusterDeployment) bool {
		stalled := condition(cd, capstanv1.ConditionStalled)
		return stalled != nil && stalled.Status == metav1.ConditionTrue && cd.Status.Pivot != nil && cd.Status.Pivot.Message != ""
	})
	const want = "the target serves no version of capstan.dev; install Capstan's CRDs there first"
	if msg := stage(cd, "Pivot").Message; !strings.Contains(msg, want) || !strings.Contains(msg, "nothing changed") {
		t.Errorf("stage Pivot: %q; want the preflight's problem (%q)", msg, want)
	}
	if !strings.Contains(cd.Status.Pivot.Message, want) || cd.Status.Pivot.Phase != "" {
		t.Errorf("status.pivot = %+v; want no phase done and the problem", cd.Status.Pivot)
	}
	if cd.Spec.Suspend || cd.Annotations[pivot.MirrorAnnotation] != "" {
		t.Errorf("the deployment was paused or mirrored by a move that did not start: suspend %t, %v", cd.Spec.Suspend, cd.Annotations)
	}
	if object(t, c, configMapGVK, ns, "settings") == nil {
		t.Error("ConfigMap settings left the source")
	}
	if err := tc.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{}); err == nil {
		t.Errorf("namespace %s was created in the target by a move that did not start", ns)
	}
}

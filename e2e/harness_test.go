package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
)

// waitTimeout bounds every wait of these tests; they fail, never hang.
const waitTimeout = 90 * time.Second

var widgetGVK = schema.GroupVersionKind{Group: "test.capstan.dev", Version: "v1", Kind: "Widget"}

func newClient(t testing.TB) client.Client {
	t.Helper()
	c, err := client.New(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newNamespace(t testing.TB) string {
	t.Helper()
	ns, err := env.CreateNamespace(context.Background(), "e2e")
	if err != nil {
		t.Fatal(err)
	}
	// Every daemon watches every namespace: a deployment left behind would
	// keep the daemons of later tests busy and spoil their request counts.
	t.Cleanup(func() {
		if err := testenv.DeleteAll(context.Background(), newClient(t), &capstanv1.ClusterDeploymentList{}, ns); err != nil {
			t.Errorf("delete the ClusterDeployments: %v", err)
		}
	})
	return ns
}

// startDaemon runs a daemon in-process, as `capstan run` would, with its
// API requests counted. It is closed when the test ends.
func startDaemon(t testing.TB, root *reconciler.RootOptions) (*reconciler.Daemon, *requestCounter) {
	t.Helper()
	return startDaemonWith(t, root, nil)
}

// startDaemonWith is startDaemon with options changed by tune first (the
// metrics and health addresses, for instance).
func startDaemonWith(t testing.TB, root *reconciler.RootOptions, tune func(*reconciler.Options)) (*reconciler.Daemon, *requestCounter) {
	t.Helper()
	counter := &requestCounter{}
	opts := reconciler.DefaultOptions()
	opts.Config = counter.wrap(env.Config)
	opts.MetricsAddr, opts.HealthAddr = "0", "0"
	opts.Reconciler.WaitSlice = 3 * time.Second
	opts.Root = root
	// One daemon per test, in-process: nobody to elect.
	opts.LeaderElection.Enabled = false
	if tune != nil {
		tune(&opts)
	}
	d, err := reconciler.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background()) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		if err := d.Close(); err != nil {
			t.Errorf("close daemon: %v", err)
		}
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("daemon: %v", err)
		}
	}
	t.Cleanup(stop)
	stops[d] = stop
	return d, counter
}

// stops lets a test stop a daemon before its end (restart tests).
var stops = map[*reconciler.Daemon]func(){}

func stopDaemon(d *reconciler.Daemon) { stops[d]() }

// gitSecret stores the git server's credentials for a deployment's secretRef.
func gitSecret(t testing.TB, c client.Client, ns string) string {
	t.Helper()
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "git-auth", Namespace: ns},
		StringData: map[string]string{"username": "capstan", "password": "s3cret-token"},
	}
	if err := c.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	return s.Name
}

func createDeployment(t testing.TB, c client.Client, ns, name string, spec capstanv1.ClusterDeploymentSpec) {
	t.Helper()
	cd := &capstanv1.ClusterDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       spec,
	}
	if err := c.Create(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
}

func getDeployment(t testing.TB, c client.Client, ns, name string) *capstanv1.ClusterDeployment {
	t.Helper()
	cd := &capstanv1.ClusterDeployment{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, cd); err != nil {
		t.Fatal(err)
	}
	return cd
}

// waitFor polls cond until it holds or waitTimeout passes. The daemon is
// event-driven; polling here only observes it.
func waitFor(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	waitForWithin(t, waitTimeout, what, cond)
}

// waitForWithin is waitFor with a deadline of its own, for what waits
// behind other work of the daemon.
func waitForWithin(t testing.TB, within time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s (last error: %v)", within, what, last)
}

// waitDeployment waits until the deployment's status satisfies cond.
func waitDeployment(t testing.TB, c client.Client, ns, name, what string, cond func(*capstanv1.ClusterDeployment) bool) *capstanv1.ClusterDeployment {
	t.Helper()
	var cd *capstanv1.ClusterDeployment
	waitFor(t, fmt.Sprintf("ClusterDeployment %s/%s: %s", ns, name, what), func() (bool, error) {
		cd = &capstanv1.ClusterDeployment{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, cd); err != nil {
			return false, err
		}
		if cond(cd) {
			return true, nil
		}
		return false, fmt.Errorf("status: %s", describe(cd))
	})
	return cd
}

func describe(cd *capstanv1.ClusterDeployment) string {
	s := fmt.Sprintf("revision=%s current=%s", cd.Status.Revision, cd.Status.CurrentStage)
	for _, st := range cd.Status.Stages {
		s += fmt.Sprintf(" [%s %s attempts=%d %q]", st.Name, st.State, st.Attempts, st.Message)
	}
	for _, c := range cd.Status.Conditions {
		s += fmt.Sprintf(" %s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message)
	}
	return s
}

func isReady(cd *capstanv1.ClusterDeployment) bool {
	for _, c := range cd.Status.Conditions {
		if c.Type == capstanv1.ConditionReady {
			return c.Status == metav1.ConditionTrue && c.ObservedGeneration == cd.Generation
		}
	}
	return false
}

func condition(cd *capstanv1.ClusterDeployment, typ string) *metav1.Condition {
	for i := range cd.Status.Conditions {
		if cd.Status.Conditions[i].Type == typ {
			return &cd.Status.Conditions[i]
		}
	}
	return nil
}

func stage(cd *capstanv1.ClusterDeployment, name string) capstanv1.StageStatus {
	for _, st := range cd.Status.Stages {
		if st.Name == name {
			return st
		}
	}
	return capstanv1.StageStatus{}
}

// object reads an object, or returns nil when it does not exist.
func object(t testing.TB, c client.Client, gvk schema.GroupVersionKind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, u)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return u
}

var configMapGVK = schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}

// setWidgetReady plays the controller that marks a Widget ready.
func setWidgetReady(t testing.TB, c client.Client, ns, name string) {
	t.Helper()
	w := object(t, c, widgetGVK, ns, name)
	if w == nil {
		t.Fatalf("Widget %s/%s does not exist", ns, name)
	}
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"status":{"ready":true}}`))
	if err := c.Status().Patch(context.Background(), w, patch); err != nil {
		t.Fatal(err)
	}
}

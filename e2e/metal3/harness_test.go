package metal3

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
)

// The daemon in-process against the real providers, as e2e/harness_test.go
// runs it against the simulator: what a test needs to commit an overlay,
// start a daemon and follow its deployment's status.

// gitUser and gitPassword are the git server's credentials, which every
// deployment reads from its secretRef.
const (
	gitUser     = "capstan"
	gitPassword = "s3cret-token"
)

func newClient(t testing.TB) client.Client {
	t.Helper()
	c, err := client.New(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newNamespace creates the test's namespace. Its ClusterDeployments are
// deleted when the test ends, so that a daemon of a later test has nothing
// of it to walk; the providers' objects stay, as a failed test left them.
func newNamespace(t testing.TB, prefix string) string {
	t.Helper()
	ns, err := env.CreateNamespace(context.Background(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := testenv.DeleteAll(context.Background(), newClient(t), &capstanv1.ClusterDeploymentList{}, ns); err != nil {
			t.Errorf("delete the ClusterDeployments: %v", err)
		}
	})
	return ns
}

// startDaemon runs a daemon in-process, as `capstan run` would, after tune
// (nil for none) changed its options, and closes it when the test ends.
func startDaemon(t testing.TB, tune func(*reconciler.Options)) {
	t.Helper()
	opts := reconciler.DefaultOptions()
	opts.Config = env.Config
	opts.MetricsAddr, opts.HealthAddr = "0", "0"
	opts.Reconciler.WaitSlice = 3 * time.Second
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
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close daemon: %v", err)
		}
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("daemon: %v", err)
		}
	})
}

// gitSecret stores the git server's credentials for a deployment's
// secretRef.
func gitSecret(t testing.TB, c client.Client, ns string) string {
	t.Helper()
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "git-auth", Namespace: ns},
		StringData: map[string]string{"username": gitUser, "password": gitPassword},
	}
	if err := c.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	return s.Name
}

// waitFor polls cond until it holds or timeout passes, then fails the test
// with cond's last error. The daemon and the providers are event-driven;
// polling here only observes them.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last: %v)", timeout, what, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitDeployment waits until the deployment's status satisfies cond.
func waitDeployment(t testing.TB, c client.Client, ns, name string, timeout time.Duration, what string, cond func(*capstanv1.ClusterDeployment) bool) *capstanv1.ClusterDeployment {
	t.Helper()
	var cd *capstanv1.ClusterDeployment
	waitFor(t, timeout, fmt.Sprintf("ClusterDeployment %s/%s: %s", ns, name, what), func() (bool, error) {
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
		s += fmt.Sprintf(" [%s %s attempts=%d stuck=%t %q]", st.Name, st.State, st.Attempts, st.Stuck, st.Message)
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

// stageDurations lists how long each finished stage took, from its status.
func stageDurations(cd *capstanv1.ClusterDeployment) string {
	var parts []string
	for _, st := range cd.Status.Stages {
		if st.StartedAt != nil && st.FinishedAt != nil {
			parts = append(parts, fmt.Sprintf("%s %s", st.Name, st.FinishedAt.Sub(st.StartedAt.Time)))
		}
	}
	return strings.Join(parts, ", ")
}

// stageWatch follows a deployment's status from a watch. It records when
// (at which resource version of the deployment) each stage was first seen
// Ready, what each stage said while in progress, and every moment a stage
// ran while an earlier one was not Ready.
type stageWatch struct {
	mu         sync.Mutex
	readyOrder []string
	readyAt    map[string]int64    // stage -> resource version of the first status that shows it Ready
	messages   map[string][]string // stage -> its messages while InProgress, each change once
	violations []string
}

func watchStages(t *testing.T, ns, name string) *stageWatch {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := c.Watch(ctx, &capstanv1.ClusterDeploymentList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	sw := &stageWatch{readyAt: map[string]int64{}, messages: map[string][]string{}}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			cd, ok := ev.Object.(*capstanv1.ClusterDeployment)
			if !ok || cd.Name != name {
				continue
			}
			sw.observe(cd)
		}
	}()
	return sw
}

func (sw *stageWatch) observe(cd *capstanv1.ClusterDeployment) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	blocked := ""
	for _, st := range cd.Status.Stages {
		if blocked != "" && st.State != capstanv1.StagePending {
			sw.violations = append(sw.violations, fmt.Sprintf("%s is %s while %s is not Ready", st.Name, st.State, blocked))
		}
		if msgs := sw.messages[st.Name]; st.State == capstanv1.StageInProgress && st.Message != "" && (len(msgs) == 0 || msgs[len(msgs)-1] != st.Message) {
			sw.messages[st.Name] = append(msgs, st.Message)
		}
		if st.State == capstanv1.StageReady && !slices.Contains(sw.readyOrder, st.Name) {
			sw.readyOrder = append(sw.readyOrder, st.Name)
			sw.readyAt[st.Name] = resourceVersion(cd)
		}
		if st.State != capstanv1.StageReady && blocked == "" {
			blocked = st.Name
		}
	}
}

// freeLoopbackPort returns a TCP port of 127.0.0.1 that nothing listens on
// at the time of the call.
func freeLoopbackPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// providerLogs prints the end of every provider's log when the test has
// failed: what the controllers said is the first thing to read.
func providerLogs(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, p := range testenv.Providers {
			data, err := os.ReadFile(env.LogPath(p.Name))
			if err != nil {
				t.Logf("%s log: %v", p.Name, err)
				continue
			}
			lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
			if len(lines) > 40 {
				lines = lines[len(lines)-40:]
			}
			t.Logf("%s log (last %d lines):\n%s", p.Name, len(lines), strings.Join(lines, "\n"))
		}
	})
}

// dumpStatus logs the status of the named kinds in ns when the test ends
// failed or skipped: what the controllers wrote is where a walk that
// stopped is explained.
func dumpStatus(t *testing.T, ns string, gvks ...schema.GroupVersionKind) {
	t.Cleanup(func() {
		if !t.Failed() && !t.Skipped() {
			return
		}
		c := newClient(t)
		for _, gvk := range gvks {
			list := &unstructured.UnstructuredList{}
			list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
			if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
				t.Logf("list %s: %v", gvk.Kind, err)
				continue
			}
			for _, item := range list.Items {
				status, err := yaml.Marshal(item.Object["status"])
				if err != nil {
					status = []byte(err.Error())
				}
				t.Logf("%s %s (generation %d) status:\n%s", gvk.Kind, item.GetName(), item.GetGeneration(), status)
			}
		}
	})
}

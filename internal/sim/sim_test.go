package sim

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/stages"
)

// TestSimulator runs the simulator against a real API server with the
// real Cluster API and Metal3 CRDs, one namespace per subtest: a cluster
// built in seed 002's order until every capm3 stage is ready, the two
// faults, an upgrade and a scale down, and the kubeconfig Secret.
func TestSimulator(t *testing.T) {
	env := sharedEnv(t)
	t.Run("ClusterReadyInSeedOrder", func(t *testing.T) { testClusterReadyInSeedOrder(t, env) })
	t.Run("StuckHostUntilFaultCleared", func(t *testing.T) { testStuckHost(t, env) })
	t.Run("FirstProvisioningFails", func(t *testing.T) { testProvisioningFailsOnce(t, env) })
	t.Run("UpgradeReplacesMachinesOneByOne", func(t *testing.T) { testUpgrade(t, env) })
	t.Run("ScaleDownReleasesHost", func(t *testing.T) { testScaleDown(t, env) })
	t.Run("ExecutorWalksCAPM3Plan", func(t *testing.T) { testExecutorWalk(t, env) })
	t.Run("ClusterDeletionFreesHosts", func(t *testing.T) { testClusterDeletion(t, env) })
	t.Run("KubeconfigSecret", func(t *testing.T) { testKubeconfigSecret(t, env) })
}

// simFixture is one test's namespace holding testdata/cluster.yaml, a
// client, and a record of every change to its hosts, machines and
// control plane.
type simFixture struct {
	t    *testing.T
	env  *testenv.Env
	c    client.WithWatch
	ns   string
	objs []*unstructured.Unstructured
	rec  *changeRecorder
}

// newSimFixture creates the namespace, starts recording, and creates the
// fixture's objects after edit has changed them.
func newSimFixture(t *testing.T, env *testenv.Env, edit func(kind, name string, obj *unstructured.Unstructured)) *simFixture {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(t.Context(), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	f := &simFixture{t: t, env: env, c: c, ns: ns}
	f.rec = recordChanges(t, c, ns, kindBareMetalHost, kindMachine, kindKubeadmControlPlane)
	f.objs = loadFixture(t, "testdata/cluster.yaml", ns)
	for _, o := range f.objs {
		if edit != nil {
			edit(o.GetKind(), o.GetName(), o)
		}
		if err := c.Create(t.Context(), o.DeepCopy()); err != nil {
			t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	return f
}

func loadFixture(t *testing.T, file, ns string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("read %s: %v", file, err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &u.Object); err != nil {
			t.Fatalf("read %s: %v", file, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		u.SetNamespace(ns)
		objs = append(objs, u)
	}
}

// startSimulator runs a simulator on the fixture's namespace until the
// test ends, and collects its events.
func (f *simFixture) startSimulator(opts Options) (*Simulator, *eventLog) {
	f.t.Helper()
	events := &eventLog{}
	opts.Namespace = f.ns
	opts.Events = events.add
	opts.Logger = logr.Discard()
	if os.Getenv("SIM_LOG") != "" {
		opts.Logger = testr.NewWithOptions(f.t, testr.Options{Verbosity: 2})
	}
	s, err := New(f.env.Config, opts)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	f.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.t.Errorf("simulator: %v", err)
		}
		if f.t.Failed() || os.Getenv("SIM_EVENTS") != "" {
			f.t.Logf("simulator events:\n%s", events)
		}
	})
	return s, events
}

// waitReady waits until every readiness check of every capm3 stage passes
// on the fixture's live objects, and fails with the first unmet check of
// each stage when the deadline passes.
func (f *simFixture) waitReady(ctx context.Context) {
	f.t.Helper()
	profile, err := stages.LoadProfile("capm3")
	if err != nil {
		f.t.Fatal(err)
	}
	plan, err := stages.BuildPlan(profile.Stages, f.objs)
	if err != nil {
		f.t.Fatal(err)
	}
	var waiting []string
	err = pollUntil(ctx, func() (bool, error) {
		waiting = waiting[:0]
		for _, st := range plan.Stages {
			checker, err := stages.NewChecker(st.ReadyWhen)
			if err != nil {
				return false, err
			}
			for _, o := range st.Objects {
				live := f.get(o.GroupVersionKind(), o.GetName())
				if live == nil {
					return false, fmt.Errorf("%s %s is gone", o.GetKind(), o.GetName())
				}
				if v := checker.Evaluate(live); !v.Ready {
					waiting = append(waiting, fmt.Sprintf("%s: %s %s: %s", st.Name, o.GetKind(), o.GetName(), v.Message))
					break
				}
			}
		}
		return len(waiting) == 0, nil
	})
	if err != nil {
		f.t.Fatalf("capm3 stages not ready: %v\n%s", err, strings.Join(waiting, "\n"))
	}
}

// get reads a live object, nil if it does not exist.
func (f *simFixture) get(gvk schema.GroupVersionKind, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	if err := f.c.Get(f.t.Context(), types.NamespacedName{Namespace: f.ns, Name: name}, u); err != nil {
		return nil
	}
	return u
}

func (f *simFixture) list(gvk schema.GroupVersionKind) []unstructured.Unstructured {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := f.c.List(f.t.Context(), l, client.InNamespace(f.ns)); err != nil {
		f.t.Fatal(err)
	}
	return l.Items
}

// waitFor polls until cond holds for the live object.
func (f *simFixture) waitFor(ctx context.Context, gvk schema.GroupVersionKind, name, what string, cond func(*unstructured.Unstructured) bool) {
	f.t.Helper()
	var last *unstructured.Unstructured
	err := pollUntil(ctx, func() (bool, error) {
		last = f.get(gvk, name)
		return last != nil && cond(last), nil
	})
	if err != nil {
		status := any(nil)
		if last != nil {
			status = last.Object["status"]
		}
		f.t.Fatalf("%s %s: %s: %v\nstatus: %v", gvk.Kind, name, what, err, status)
	}
}

// patch changes a user's spec with a merge patch, as a git push would.
func (f *simFixture) patch(gvk schema.GroupVersionKind, name, patch string) {
	f.t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(f.ns)
	u.SetName(name)
	if err := f.c.Patch(f.t.Context(), u, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		f.t.Fatalf("patch %s %s: %v", gvk.Kind, name, err)
	}
}

// pollUntil calls cond every 20 ms until it holds, fails, or ctx ends.
func pollUntil(ctx context.Context, cond func() (bool, error)) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func withDeadline(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// eventLog collects the simulator's events.
type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

// count is how many events say msg.
func (l *eventLog) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.events {
		if e.Message == msg {
			n++
		}
	}
	return n
}

func (l *eventLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, e := range l.events {
		fmt.Fprintf(&b, "  %6.3fs %s [%s]\n", e.Time.Sub(l.events[0].Time).Seconds(), e, e.Controller)
	}
	return b.String()
}

// recordedChange is one version of an object a watch delivered; rv orders changes
// across kinds, since one etcd numbers every write.
type recordedChange struct {
	rv      int64
	kind    string
	name    string
	deleted bool
	obj     *unstructured.Unstructured
}

// changeRecorder keeps every change to some kinds in one namespace.
type changeRecorder struct {
	mu      sync.Mutex
	changes []recordedChange
}

func recordChanges(t *testing.T, c client.WithWatch, ns string, kinds ...schema.GroupVersionKind) *changeRecorder {
	t.Helper()
	r := &changeRecorder{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, gvk := range kinds {
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		w, err := c.Watch(ctx, l, client.InNamespace(ns))
		if err != nil {
			cancel()
			t.Fatalf("watch %s: %v", gvk.Kind, err)
		}
		wg.Go(func() {
			defer w.Stop()
			for ev := range w.ResultChan() {
				u, ok := ev.Object.(*unstructured.Unstructured)
				if !ok {
					continue
				}
				rv, _ := strconv.ParseInt(u.GetResourceVersion(), 10, 64)
				r.mu.Lock()
				r.changes = append(r.changes, recordedChange{rv: rv, kind: gvk.Kind, name: u.GetName(), deleted: ev.Type == watch.Deleted, obj: u})
				r.mu.Unlock()
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r
}

// history returns the recorded changes in the order etcd wrote them.
func (r *changeRecorder) history() []recordedChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]recordedChange(nil), r.changes...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].rv < out[j-1].rv; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// hostStates returns the provisioning states a host went through, without
// repeats.
func hostStates(h []recordedChange, name string) []string {
	var states []string
	for _, c := range h {
		if c.kind != kindBareMetalHost.Kind || c.name != name {
			continue
		}
		s := str(c.obj.Object, "status", "provisioning", "state")
		if s == "" {
			continue
		}
		if str(c.obj.Object, "status", "operationalStatus") == "error" {
			s += "(error)"
		}
		if len(states) == 0 || states[len(states)-1] != s {
			states = append(states, s)
		}
	}
	return states
}

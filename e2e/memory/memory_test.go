package memory

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/manifests"
	"github.com/capstan-dev/capstan/reconciler"
)

// bombBytes is the compressed size of each gzip bomb, as in the issue.
const bombBytes = 64 << 20

// hostile is one deployment of the test: where its source is, and what
// its status must say. An empty want means it must become Ready.
type hostile struct {
	name string
	// source is filled in by the test once the content is pushed.
	source *capstanv1.SourceSpec
	path   string
	want   []string
}

// The memory test: four deployments on 64 MiB gzip bombs, one on a
// 50 MB YAML file, one on a repository with 70 MB of files no
// kustomization reaches, all at once, on the capstan binary run as its own
// process with the memory settings the shipped Deployment gives it. Each
// hostile one stops with an error naming the limit and the flag that
// raises it; the one with unrelated files renders and becomes Ready; the
// daemon's peak RSS (VmHWM) stays under the shipped memory limit. Three
// more deployments render overlays just under --max-render-bytes (small
// ConfigMaps, kustomize's costliest input per byte) at the same time, so
// that the peak includes the most that renders may take at the defaults.
//
// CAPSTAN_MEMORY_BINARY runs another capstan binary instead of building
// this tree's, and CAPSTAN_MEMORY_MEASURE_ONLY=1 only reports its peak:
// that is how docs/benchmarks.md has the numbers from before the limits.
func TestMemoryStaysBoundedOnHostileSources(t *testing.T) {
	if testing.Short() {
		t.Skip("pushes 256 MiB of gzip bombs and 120 MB of git content")
	}
	measureOnly := os.Getenv("CAPSTAN_MEMORY_MEASURE_ONLY") == "1"
	limit, goMemLimit := shippedMemory(t)
	t.Logf("the shipped Deployment: memory limit %s, GOMEMLIMIT %q", limit.String(), goMemLimit)

	ns, err := env.CreateNamespace(context.Background(), "memory")
	if err != nil {
		t.Fatal(err)
	}
	deployments := []*hostile{
		{name: "bomb-pax", path: "clusters/app", want: []string{"--max-decompressed-bytes=256MiB"}},
		{name: "bomb-pax-global", path: "clusters/app", want: []string{"--max-decompressed-bytes=256MiB"}},
		{name: "bomb-zeros", path: "clusters/app", want: []string{"--max-artifact-bytes=128MiB"}},
		{name: "bomb-one-file", path: "clusters/app", want: []string{"1099511627776 bytes", "--max-file-bytes=8MiB"}},
		{name: "big-yaml", path: "clusters/big", want: []string{"clusters/big/big.yaml", "--max-file-bytes=8MiB"}},
		{name: "unrelated-files", path: "clusters/app"},
		// These render, then stop at the plan (one object names a stage
		// that does not exist), so that they render at the limit of what
		// a render may read without applying thousands of objects.
		{name: "render-at-limit-a", path: "clusters/full", want: []string{`"nowhere" names no stage of the plan`}},
		{name: "render-at-limit-b", path: "clusters/full", want: []string{`"nowhere" names no stage of the plan`}},
		{name: "render-at-limit-c", path: "clusters/full", want: []string{`"nowhere" names no stage of the plan`}},
	}
	pushContent(t, ns, deployments)

	bin := capstanBinary(t)
	d := startCapstan(t, bin, goMemLimit)
	c, err := client.New(env.Config, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range deployments {
		cd := &capstanv1.ClusterDeployment{
			ObjectMeta: metav1.ObjectMeta{Name: h.name, Namespace: ns},
			Spec:       capstanv1.ClusterDeploymentSpec{Source: h.source, Path: h.path},
		}
		if err := c.Create(context.Background(), cd); err != nil {
			t.Fatal(err)
		}
	}

	deadline := time.Now().Add(8 * time.Minute)
	pending := map[string]*hostile{}
	for _, h := range deployments {
		pending[h.name] = h
	}
	for len(pending) > 0 && time.Now().Before(deadline) && d.running() {
		for n, h := range pending {
			cd := &capstanv1.ClusterDeployment{}
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: n}, cd); err != nil {
				t.Fatal(err)
			}
			ready := readyCondition(cd)
			switch {
			case ready == nil || ready.ObservedGeneration != cd.Generation:
				continue
			case measureOnly && (ready.Status == metav1.ConditionTrue || stalled(cd)):
				t.Logf("%s: Ready=%s: %s", n, ready.Status, ready.Message)
				delete(pending, n)
			case h.want == nil && ready.Status == metav1.ConditionTrue:
				t.Logf("%s: Ready", n)
				delete(pending, n)
			case h.want != nil && stalled(cd) && containsAll(ready.Message, h.want):
				t.Logf("%s: %s", n, ready.Message)
				delete(pending, n)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	peak, rss := d.stop(t)
	t.Logf("daemon peak RSS (VmHWM) %d MiB, RSS at the end %d MiB, shipped limit %d MiB",
		peak>>20, rss>>20, limit.Value()>>20)
	for n, h := range pending {
		cd := &capstanv1.ClusterDeployment{}
		_ = c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: n}, cd)
		msg := "no Ready condition"
		if r := readyCondition(cd); r != nil {
			msg = fmt.Sprintf("Ready=%s %s: %s", r.Status, r.Reason, r.Message)
		}
		switch {
		case h.want == nil:
			t.Errorf("%s did not become Ready: %s", n, msg)
		default:
			t.Errorf("%s: want a stalled deployment whose message contains %q; got %s", n, h.want, msg)
		}
	}
	if !measureOnly && peak >= limit.Value() {
		t.Errorf("the daemon's peak RSS is %d MiB, not under the shipped limit of %d MiB", peak>>20, limit.Value()>>20)
	}
}

func readyCondition(cd *capstanv1.ClusterDeployment) *metav1.Condition {
	for i := range cd.Status.Conditions {
		if cd.Status.Conditions[i].Type == capstanv1.ConditionReady {
			return &cd.Status.Conditions[i]
		}
	}
	return nil
}

func stalled(cd *capstanv1.ClusterDeployment) bool {
	for _, c := range cd.Status.Conditions {
		if c.Type == capstanv1.ConditionStalled {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// shippedMemory reads the memory limit and the GOMEMLIMIT of the
// Deployment that manifests/ installs.
func shippedMemory(t *testing.T) (resource.Quantity, string) {
	t.Helper()
	ctr, err := manifests.DaemonContainer()
	if err != nil {
		t.Fatal(err)
	}
	limit, ok := ctr.Resources.Limits["memory"]
	if !ok {
		t.Fatal("the shipped Deployment sets no memory limit")
	}
	return limit, manifests.Env(ctr, "GOMEMLIMIT")
}

// capstanBinary builds cmd/capstan, or returns CAPSTAN_MEMORY_BINARY.
func capstanBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("CAPSTAN_MEMORY_BINARY"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "capstan")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/capstan")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// daemon is `capstan run` as a process, its RSS sampled.
type daemon struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	mu   sync.Mutex
	err  error
}

// startCapstan runs `capstan run` the way the shipped Deployment does,
// with GOMEMLIMIT as it sets it and TMPDIR in the test's directory (the
// default artifact cache is below it).
func startCapstan(t *testing.T, bin, goMemLimit string) *daemon {
	t.Helper()
	dir := t.TempDir()
	logFile, err := os.Create(filepath.Join(dir, "capstan.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--kubeconfig", env.KubeconfigPath,
		"--metrics-addr=0", "--health-addr=0", "--leader-elect=false", "--log-format=text")
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	if goMemLimit != "" {
		cmd.Env = append(cmd.Env, "GOMEMLIMIT="+goMemLimit)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: cmd, log: logFile.Name(), done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		d.mu.Lock()
		d.err = err
		d.mu.Unlock()
		logFile.Close()
		close(d.done)
	}()
	t.Cleanup(func() {
		if d.running() {
			cmd.Process.Kill()
			<-d.done
		}
		if t.Failed() {
			if out, err := os.ReadFile(d.log); err == nil {
				t.Logf("capstan run output (last 8 KiB):\n%s", out[max(0, len(out)-8<<10):])
			}
		}
	})
	return d
}

func (d *daemon) running() bool {
	select {
	case <-d.done:
		return false
	default:
		return true
	}
}

// stop reads the process's peak and current RSS, then stops it.
func (d *daemon) stop(t *testing.T) (peak, rss int64) {
	t.Helper()
	if !d.running() {
		d.mu.Lock()
		defer d.mu.Unlock()
		t.Fatalf("capstan run exited early: %v", d.err)
	}
	status := fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid)
	peak, rss = readKB(t, status, "VmHWM:"), readKB(t, status, "VmRSS:")
	d.cmd.Process.Signal(os.Interrupt)
	select {
	case <-d.done:
	case <-time.After(time.Minute):
		d.cmd.Process.Kill()
		<-d.done
	}
	return peak, rss
}

func readKB(t *testing.T, file, field string) int64 {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), field); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("%s has no %s", file, field)
	return 0
}

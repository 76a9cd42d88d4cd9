package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/reconciler"
)

// devHostsFile is the example file the tests break and fix.
var devHostsFile = filepath.Join("clusters", "mgmt", "overlay", "hosts.yaml")

// `capstan dev --dir` on a copy of examples/ with a BareMetalHost the
// schema rejects stays up and prints the error; it serves metrics and
// writes a kubeconfig at its fixed path that kubectl-style clients and
// `capstan status` use without -n; once the file is fixed it walks the
// cluster to Ready. After SIGTERM it exits 0, no file it made is left in
// its home or temporary directory, and none of its processes runs.
func TestDevStaysOnABrokenExampleAndCleansUpAfterSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second control plane")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	examples := copyExamples(t)
	hosts := filepath.Join(examples, devHostsFile)
	good := replaceInFile(t, hosts, "bootMode: UEFI", "bootMode: Banana")

	d := startDev(ctx, t, "dev", "--dir", examples, "--sim-speed", "20")
	export := d.waitLine("the export line", func(l string) bool { return strings.Contains(l, "export KUBECONFIG=") })
	stalled := d.waitLine("the stall", func(l string) bool { return strings.Contains(l, "mgmt stalled at") })
	if !strings.Contains(stalled, `"Banana"`) || !strings.Contains(stalled, "spec.bootMode") {
		t.Errorf("the stall does not say what the server rejected: %q", stalled)
	}
	kubeconfig := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(export), "export KUBECONFIG="))
	if want := filepath.Join(d.home, ".cache", "capstan", "dev", "kubeconfig"); kubeconfig != want {
		t.Errorf("kubeconfig at %s, want the fixed path %s", kubeconfig, want)
	}
	checkDevKubeconfig(ctx, t, d, kubeconfig)
	children := d.processes()
	if len(children) < 2 {
		t.Errorf("found %d processes of capstan dev (%v), want etcd and kube-apiserver at least", len(children), children)
	}

	if err := os.WriteFile(hosts, good, 0o644); err != nil {
		t.Fatal(err)
	}
	d.waitLine("Ready once the file is fixed", func(l string) bool { return strings.Contains(l, "mgmt is Ready at") })
	// The preflight refused the broken revision before any stage started
	// (its schema check sees objects whose namespace the plan creates), so
	// the stages have states to export only now.
	checkDevMetrics(t, d)

	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(); err != nil {
		t.Errorf("capstan dev after SIGTERM: %v\n%s", err, d.output())
	}
	d.checkNothingLeft(children)
}

// With its output closed early (piped into head, which exited), `capstan
// dev` stops instead of dying of SIGPIPE: it says why on stderr, and
// leaves no file (the git repository of examples/ included) and no
// process behind.
func TestDevCleansUpWhenItsOutputCloses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a second control plane")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	d := startDev(ctx, t, "dev", "--sim-speed", "20")
	d.waitLine("the git repository", func(l string) bool { return strings.Contains(l, "root source: http") })
	children := d.processes()
	if len(children) < 2 {
		t.Errorf("found %d processes of capstan dev (%v), want etcd and kube-apiserver at least", len(children), children)
	}
	d.stdout.Close() // what head does when it has read enough
	err := d.wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("capstan dev with its output closed: %v, want exit status 1 (not killed by SIGPIPE)", err)
	}
	if !strings.Contains(d.stderr.String(), "output cannot be written") {
		t.Errorf("stderr does not say why it stopped:\n%s", d.stderr.String())
	}
	d.checkNothingLeft(children)
}

// devRun is a `capstan dev` started as a user starts it, with a home and
// a temporary directory of its own.
type devRun struct {
	t         *testing.T
	ctx       context.Context
	cmd       *exec.Cmd
	home, tmp string
	stdout    io.ReadCloser
	stderr    *bytes.Buffer
	lines     chan string
	out       strings.Builder
	done      chan struct{} // closed once it exited, exitErr set
	exitErr   error
}

// startDev starts the binary with args in the repository root, with HOME
// and TMPDIR fresh; the test binaries and Go's caches stay where they
// are, so nothing is built or downloaded into the fresh home.
func startDev(ctx context.Context, t *testing.T, args ...string) *devRun {
	t.Helper()
	bin := capstanBinary(t)
	binDir, err := testenv.EnsureBinaries(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	goEnv, err := exec.Command("go", "env", "GOCACHE", "GOMODCACHE", "GOPATH").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	goDirs := strings.Fields(string(goEnv))
	config, err := os.UserConfigDir()
	if err != nil {
		t.Fatal(err)
	}
	d := &devRun{t: t, ctx: ctx, home: t.TempDir(), tmp: t.TempDir(), stderr: &bytes.Buffer{},
		lines: make(chan string, 1024), done: make(chan struct{})}
	d.cmd = exec.Command(bin, args...)
	d.cmd.Dir = ".."
	d.cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains([]string{"HOME", "TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "KUBECONFIG"}, name)
	}), "HOME="+d.home, "TMPDIR="+d.tmp, "CAPSTAN_TESTBIN_DIR="+binDir, "XDG_CONFIG_HOME="+config,
		"GOCACHE="+goDirs[0], "GOMODCACHE="+goDirs[1], "GOPATH="+goDirs[2])
	d.cmd.Stderr = d.stderr
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	d.cmd.Stdout = w
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	d.stdout = r
	t.Cleanup(func() {
		// A failed test must not leave it running.
		d.cmd.Process.Kill()
		<-d.done
	})
	go func() {
		defer close(d.lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			d.lines <- sc.Text()
		}
	}()
	go func() {
		d.exitErr = d.cmd.Wait()
		close(d.done)
	}()
	return d
}

// waitLine reads the output until a line matches, and returns it.
func (d *devRun) waitLine(what string, match func(string) bool) string {
	d.t.Helper()
	for {
		select {
		case line, ok := <-d.lines:
			if !ok {
				d.t.Fatalf("capstan dev ended before %s:\n%s\nstderr:\n%s", what, d.output(), d.stderr.String())
			}
			d.out.WriteString(line + "\n")
			if match(line) {
				return line
			}
		case <-d.ctx.Done():
			d.t.Fatalf("no %s before the deadline:\n%s", what, d.output())
		}
	}
}

func (d *devRun) output() string { return d.out.String() }

// wait waits for the process to exit, reading what is left of its output.
func (d *devRun) wait() error {
	select {
	case <-d.done:
		for line := range d.lines {
			d.out.WriteString(line + "\n")
		}
		return d.exitErr
	case <-d.ctx.Done():
		d.t.Fatalf("capstan dev did not exit before the deadline:\n%s", d.output())
		return nil
	}
}

// processes are the ids of the processes capstan dev started and that
// still run: those whose environment or command line names its
// temporary or home directory (children inherit TMPDIR), itself aside.
func (d *devRun) processes() []int {
	d.t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		d.t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == d.cmd.Process.Pid {
			continue
		}
		environ, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		for _, s := range [][]byte{environ, cmdline} {
			if bytes.Contains(s, []byte("TMPDIR="+d.tmp+"\x00")) || bytes.Contains(s, []byte(d.tmp)) || bytes.Contains(s, []byte(d.home)) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// checkNothingLeft fails the test for every file left in the home and
// temporary directories (both empty when it started) and every process
// still running that it started: those seen while it ran, and any other
// that names its directories.
func (d *devRun) checkNothingLeft(children []int) {
	d.t.Helper()
	for _, dir := range []string{d.home, d.tmp} {
		var left []string
		filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
			if path != dir {
				left = append(left, path)
			}
			return nil
		})
		if len(left) > 0 {
			d.t.Errorf("capstan dev left %d files in %s: %s", len(left), dir, strings.Join(left[:min(len(left), 20)], ", "))
		}
	}
	var running []string
	for _, pid := range append(children, d.processes()...) {
		if cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline")); err == nil {
			if state, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat")); !isZombie(state) {
				running = append(running, strconv.Itoa(pid)+" "+string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
			}
		}
	}
	if len(running) > 0 {
		d.t.Errorf("processes of capstan dev still run after it exited:\n%s", strings.Join(running, "\n"))
	}
}

// isZombie reads the state field of /proc/<pid>/stat.
func isZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// checkDevKubeconfig: the kubeconfig's current context defaults to the
// demo's namespace, and lists its deployments there, as `capstan status`
// does with KUBECONFIG set and no -n.
func checkDevKubeconfig(ctx context.Context, t *testing.T, d *devRun, path string) {
	t.Helper()
	raw, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatalf("read the kubeconfig capstan dev printed: %v", err)
	}
	if c := raw.Contexts[raw.CurrentContext]; c == nil || c.Namespace != "capstan-system" {
		t.Errorf("current context %q of %s: %+v, want namespace capstan-system", raw.CurrentContext, path, c)
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*raw, nil).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: reconciler.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	cd := &capstanv1.ClusterDeployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "capstan-system", Name: "mgmt"}, cd); err != nil {
		t.Errorf("get ClusterDeployment mgmt through %s: %v", path, err)
	}
	status := exec.CommandContext(ctx, capstanBinary(t), "status")
	status.Env = append(os.Environ(), "KUBECONFIG="+path)
	out, err := status.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "capstan-system/mgmt") {
		t.Errorf("capstan status with KUBECONFIG=%s: %v\n%s", path, err, out)
	}
}

// metricsURL finds the metrics endpoint in the output.
var metricsURL = regexp.MustCompile(`metrics (http://\S+/metrics)`)

// checkDevMetrics: the metrics endpoint dev printed serves Capstan's
// metrics.
func checkDevMetrics(t *testing.T, d *devRun) {
	t.Helper()
	m := metricsURL.FindStringSubmatch(d.output())
	if m == nil {
		t.Errorf("no metrics address in the output:\n%s", d.output())
		return
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Errorf("GET %s: %v", m[1], err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !bytes.Contains(body, []byte("capstan_stage_state")) {
		t.Errorf("GET %s: %s, no capstan_stage_state in %d bytes", m[1], resp.Status, len(body))
	}
}

// copyExamples copies examples/ into a temporary directory.
func copyExamples(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("../examples")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// replaceInFile replaces the first old with new in path and returns the
// content it had.
func replaceInFile(t *testing.T, path, old, with string) []byte {
	t.Helper()
	content, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(content, []byte(old)) {
		t.Fatalf("%s has no %q", path, old)
	}
	if err := os.WriteFile(path, bytes.Replace(content, []byte(old), []byte(with), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	return content
}

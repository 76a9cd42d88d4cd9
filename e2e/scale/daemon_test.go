package scale

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capstan-dev/capstan/manifests"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

var buildOnce struct {
	sync.Once
	dir, path string
	err       error
}

// removeBinary removes the binary capstanBinary built, if any; TestMain
// calls it once every test has run.
func removeBinary() {
	if buildOnce.dir != "" {
		os.RemoveAll(buildOnce.dir)
	}
}

// capstanBinary builds cmd/capstan once per test binary, or returns
// CAPSTAN_SCALE_BINARY (to measure another build, e.g. one from before a
// change).
func capstanBinary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("CAPSTAN_SCALE_BINARY"); bin != "" {
		return bin
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "capstan-scale-")
		if err != nil {
			buildOnce.err = err
			return
		}
		buildOnce.dir, buildOnce.path = dir, filepath.Join(dir, "capstan")
		build := exec.Command("go", "build", "-trimpath", "-o", buildOnce.path, "./cmd/capstan")
		build.Dir = "../.."
		if out, err := build.CombinedOutput(); err != nil {
			buildOnce.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.path
}

// shippedGoMemLimit is the GOMEMLIMIT the shipped Deployment gives the
// daemon, so that the daemon collects garbage as it would in a pod.
func shippedGoMemLimit(t testing.TB) string {
	t.Helper()
	ctr, err := manifests.DaemonContainer()
	if err != nil {
		t.Fatal(err)
	}
	return manifests.Env(ctr, "GOMEMLIMIT")
}

// daemon is `capstan run` as its own process, so that its memory and CPU
// are its own.
type daemon struct {
	cmd         *exec.Cmd
	log         string
	metricsAddr string
	pprofAddr   string // "" when profiles are not served
	done        chan struct{}
	mu          sync.Mutex
	err         error
}

// startCapstan runs `capstan run` with the shipped GOMEMLIMIT, reaching
// the API server through kubeconfig, its metrics on a free loopback port,
// and its profiles too when profiles is set. The daemon's defaults
// (workers, apply concurrency) are left as shipped.
func startCapstan(t testing.TB, kubeconfig string, profiles bool) *daemon {
	t.Helper()
	bin := capstanBinary(t)
	dir := t.TempDir()
	logFile, err := os.Create(filepath.Join(dir, "capstan.log"))
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := freeAddr(t)
	args := []string{"run", "--kubeconfig", kubeconfig,
		"--metrics-addr", metricsAddr, "--health-addr=0", "--leader-elect=false", "--log-format=text"}
	var pprofAddr string
	if profiles {
		pprofAddr = freeAddr(t)
		args = append(args, "--pprof-addr", pprofAddr)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	if l := shippedGoMemLimit(t); l != "" {
		cmd.Env = append(cmd.Env, "GOMEMLIMIT="+l)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: cmd, log: logFile.Name(), metricsAddr: metricsAddr, pprofAddr: pprofAddr, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		d.mu.Lock()
		d.err = err
		d.mu.Unlock()
		logFile.Close()
		close(d.done)
	}()
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			if out, err := os.ReadFile(d.log); err == nil {
				t.Logf("capstan run output (last 8 KiB):\n%s", out[max(0, len(out)-8<<10):])
			}
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := d.scrape(); err == nil {
			return d
		}
		if !d.running() || time.Now().After(deadline) {
			d.mu.Lock()
			defer d.mu.Unlock()
			t.Fatalf("capstan run did not serve its metrics within a minute (exited: %v)", d.err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func (d *daemon) running() bool {
	select {
	case <-d.done:
		return false
	default:
		return true
	}
}

// stop interrupts the daemon and waits for it, killing it after a minute.
func (d *daemon) stop() {
	if !d.running() {
		return
	}
	_ = d.cmd.Process.Signal(os.Interrupt)
	select {
	case <-d.done:
	case <-time.After(time.Minute):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

// memory is what /proc/<pid>/status says of the daemon's memory, in
// bytes: the peak RSS (VmHWM), the RSS now, and the part of it that is
// anonymous (the Go heap, stacks) and mapped from files (the binary).
type memory struct {
	peak, rss, anon, file int64
}

func (d *daemon) memory(t testing.TB) memory {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var m memory
	fields := map[string]*int64{"VmHWM": &m.peak, "VmRSS": &m.rss, "RssAnon": &m.anon, "RssFile": &m.file}
	s := bufio.NewScanner(f)
	for s.Scan() {
		field, rest, _ := strings.Cut(s.Text(), ":")
		v, ok := fields[field]
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		*v = kb << 10
	}
	return m
}

// cpu returns the CPU time the daemon has used, user and system.
func (d *daemon) cpu(t testing.TB) time.Duration {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis start at field 3 (state). utime and stime are
	// fields 14 and 15.
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	utime, err1 := strconv.ParseInt(fields[14-3], 10, 64)
	stime, err2 := strconv.ParseInt(fields[15-3], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("read %s: utime %v, stime %v", "/proc/<pid>/stat", err1, err2)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// scrape returns the daemon's /metrics text.
func (d *daemon) scrape() (string, error) {
	resp, err := http.Get("http://" + d.metricsAddr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return string(body), nil
}

// metric sums the samples of family name on the daemon's /metrics.
func (d *daemon) metric(t testing.TB, name string) float64 {
	t.Helper()
	body, err := d.scrape()
	if err != nil {
		t.Fatalf("read the daemon's metrics: %v", err)
	}
	sum := 0.0
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("metric %s: %q: %v", name, line, err)
			}
			sum += v
		}
	}
	return sum
}

// saveProfile writes the daemon's profile name (heap, profile, ...) with
// query to dir/file.
func (d *daemon) saveProfile(t testing.TB, dir, file, name, query string) {
	t.Helper()
	resp, err := http.Get("http://" + d.pprofAddr + "/debug/pprof/" + name + "?" + query)
	if err != nil {
		t.Errorf("profile %s: %v", name, err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("profile %s: %s %v", name, resp.Status, err)
		return
	}
	path := filepath.Join(dir, file)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Error(err)
		return
	}
	t.Logf("wrote %s (go tool pprof %s)", path, path)
}

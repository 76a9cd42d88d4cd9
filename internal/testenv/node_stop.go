package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cgroupFS is where the cgroup v1 controllers (or the v2 hierarchy) are.
const cgroupFS = "/sys/fs/cgroup"

// cgroupPrefix starts the name of every node's cgroup root; the owner's
// pid follows, so a later run can tell a dead run's cgroups from a live one.
const cgroupPrefix = "capstan-testenv-"

// podTeardown bounds how long Stop waits for the kubelet to stop the pods.
const podTeardown = 30 * time.Second

// createCgroups creates root in every cgroup hierarchy: the kubelet needs
// its cgroup root to exist in each.
func createCgroups(root string) error {
	for _, h := range cgroupHierarchies() {
		if err := os.MkdirAll(filepath.Join(h, root), 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", filepath.Join(h, root), err)
		}
	}
	return nil
}

// cgroupHierarchies lists the mounted hierarchies: /sys/fs/cgroup/<controller>
// on cgroup v1, /sys/fs/cgroup itself on v2.
func cgroupHierarchies() []string {
	if _, err := os.Stat(filepath.Join(cgroupFS, "cgroup.controllers")); err == nil {
		return []string{cgroupFS}
	}
	entries, _ := os.ReadDir(cgroupFS)
	var out []string
	for _, e := range entries {
		// "unified" is an empty v2 mount beside v1 on hybrid hosts.
		if e.IsDir() && e.Name() != "unified" {
			out = append(out, filepath.Join(cgroupFS, e.Name()))
		}
	}
	return out
}

// stopNode tears the node down and leaves nothing behind: the pods are
// deleted and the kubelet given time to stop them and unmount their
// volumes; then the kubelet and scheduler stop; every process left in the
// node's cgroups is killed and the cgroups removed; containerd's shims,
// which outlive containerd, are killed; containerd stops; whatever is still
// mounted under the env's directory is unmounted.
func (e *Env) stopNode() error {
	n := e.node
	if n == nil {
		return nil
	}
	var errs []error
	// Without a scheduler the pods that controllers create in place of
	// the deleted ones stay unbound.
	if n.scheduler != nil {
		errs = append(errs, n.scheduler.stop())
	}
	if n.kubelet != nil && !n.kubelet.exited() && e.client != nil {
		errs = append(errs, e.deletePods())
	}
	if n.kubelet != nil {
		errs = append(errs, n.kubelet.stop())
	}
	errs = append(errs, killCgroup(n.cgroupRoot))
	errs = append(errs, killMatching(n.dir))
	if n.containerd != nil {
		errs = append(errs, n.containerd.stop())
	}
	errs = append(errs, unmountUnder(e.Dir))
	return errors.Join(errs...)
}

// deletePods deletes every pod and waits until containerd runs no task.
func (e *Env) deletePods() error {
	ctx, cancel := context.WithTimeout(context.Background(), podTeardown)
	defer cancel()
	nss, err := e.client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("stop node: list namespaces: %w", err)
	}
	grace := int64(1)
	for _, ns := range nss.Items {
		err := e.client.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &grace}, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("stop node: delete pods of %s: %w", ns.Name, err)
		}
	}
	for {
		out, err := e.node.ctr(ctx, "tasks", "list", "--quiet")
		if err == nil && strings.TrimSpace(out) == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			// The cgroup sweep that follows kills what is left.
			e.logf("the kubelet did not stop every container within %s: %s", podTeardown, strings.TrimSpace(out))
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// killCgroup kills every process in the cgroup root of every hierarchy
// and removes the cgroups, deepest first.
func killCgroup(root string) error {
	var errs []error
	for _, h := range cgroupHierarchies() {
		top := filepath.Join(h, root)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
		for _, d := range dirs {
			if err := emptyCgroup(d); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// emptyCgroup kills the processes of one cgroup until none is left, then
// removes it.
func emptyCgroup(dir string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids := readPids(filepath.Join(dir, "cgroup.procs"))
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stop node: processes %v in %s survive SIGKILL", pids, dir)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var err error
	for range 50 { // rmdir fails with EBUSY until the killed processes are reaped
		if err = syscall.Rmdir(dir); err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("stop node: remove cgroup %s: %w", dir, err)
}

func readPids(path string) []int {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killMatching kills every process whose command line names dir: the
// containerd shims, which get the socket path under dir as an argument.
func killMatching(dir string) error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return fmt.Errorf("stop node: %w", err)
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), dir) {
			continue
		}
		if strings.HasPrefix(filepath.Base(strings.SplitN(string(cmdline), "\x00", 2)[0]), "containerd-shim") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return nil
}

// unmountUnder unmounts every mount point at or below dir, deepest first,
// detaching those that are busy.
func unmountUnder(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return fmt.Errorf("stop node: %w", err)
	}
	var errs []error
	for _, m := range mounts {
		if err := syscall.Unmount(m, 0); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
				errs = append(errs, fmt.Errorf("stop node: unmount %s: %w", m, err))
			}
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		// Octal escapes (\040 for a space) do not occur in our paths.
		mp := fields[4]
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, sc.Err()
}

// ownerFile, in a node's directory, holds the pid of the process that
// started it.
const ownerFile = "owner.pid"

// sweepStaleNodes removes what nodes of dead test processes left: a test
// binary killed by `go test -timeout` takes containerd and the kubelet with
// it (parent-death signal), but not the shims, the containers, their
// cgroups or the volume mounts. A node's cgroup root and its directory's
// owner file name the process that started it; one whose process is gone
// is swept.
func sweepStaleNodes(logf func(string, ...any)) {
	for _, h := range cgroupHierarchies() {
		entries, _ := os.ReadDir(h)
		for _, e := range entries {
			if pid, ok := stalePid(e.Name()); ok && !alive(pid) {
				if err := killCgroup("/" + e.Name()); err != nil {
					logf("sweep stale node cgroup %s: %v", e.Name(), err)
				}
			}
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "capstan-testenv-*", "node", ownerFile))
	for _, f := range dirs {
		data, err := os.ReadFile(f)
		pid, perr := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || perr != nil || alive(pid) {
			continue
		}
		envDir := filepath.Dir(filepath.Dir(f))
		_ = killMatching(filepath.Dir(f))
		if err := unmountUnder(envDir); err != nil {
			logf("sweep stale node %s: %v", envDir, err)
			continue
		}
		if err := os.RemoveAll(envDir); err != nil {
			logf("sweep stale node %s: %v", envDir, err)
		} else {
			logf("removed the node a dead test process (pid %d) left in %s", pid, envDir)
		}
	}
}

// stalePid reads the owner pid from a cgroup name capstan-testenv-<pid>-<id>.
func stalePid(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, cgroupPrefix)
	if !ok {
		return 0, false
	}
	p, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(p)
	return pid, err == nil
}

func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil || errors.Is(syscall.Kill(pid, 0), syscall.EPERM)
}

package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// devWorkspacePrefix names the temporary directory of one `capstan dev`
// run: the control planes' data, the git repository, the artifact cache
// and the webhook token, removed as one when it exits.
const devWorkspacePrefix = "capstan-dev-"

// devContext is the kubeconfig context of the demo's (first) cluster.
const devContext = "capstan-dev"

// devWorkspace is every file one `capstan dev` run makes: a temporary
// directory, and a kubeconfig at a fixed path that it holds a lock on
// while it runs (another `capstan dev` at the same time writes its
// kubeconfig into its own workspace instead).
type devWorkspace struct {
	// Dir is the temporary directory.
	Dir string
	// Kubeconfig is where the kubeconfig is written.
	Kubeconfig string
	// Fallback says why Kubeconfig is not the path asked for; "" when it is.
	Fallback string

	lock *os.File
	// made are the directories created for the kubeconfig, deepest
	// first: removed on close when nothing else is in them.
	made []string
}

// defaultDevKubeconfig is ${XDG_CACHE_HOME:-~/.cache}/capstan/dev/kubeconfig,
// beside the test binaries' cache (e2e/testbin/build.sh).
func defaultDevKubeconfig() string {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "capstan", "dev", "kubeconfig")
}

// newDevWorkspace creates the temporary directory, first removing those
// of earlier runs that were killed before they could (their process is
// gone), and takes the kubeconfig path.
func newDevWorkspace(kubeconfig string) (*devWorkspace, error) {
	sweepDevWorkspaces(os.TempDir())
	dir, err := os.MkdirTemp("", devWorkspacePrefix)
	if err != nil {
		return nil, fmt.Errorf("create the dev workspace: %w", err)
	}
	ws := &devWorkspace{Dir: dir}
	if err := os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		ws.Close()
		return nil, fmt.Errorf("create the dev workspace: %w", err)
	}
	if kubeconfig == "" {
		ws.Kubeconfig, ws.Fallback = filepath.Join(dir, "kubeconfig"), "no home directory to keep it in"
		return ws, nil
	}
	if err := ws.takeKubeconfig(kubeconfig); err != nil {
		ws.Kubeconfig, ws.Fallback = filepath.Join(dir, "kubeconfig"), err.Error()
	}
	return ws, nil
}

// Path is a file or directory inside the workspace.
func (ws *devWorkspace) Path(name string) string { return filepath.Join(ws.Dir, name) }

// takeKubeconfig creates path and locks it, so that two runs never
// share it (and the first to exit does not remove the other's).
func (ws *devWorkspace) takeKubeconfig(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", path, err)
	}
	if ws.made, err = mkdirAllMade(filepath.Dir(abs)); err != nil {
		return err
	}
	f, err := os.OpenFile(abs, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		ws.removeMade()
		return fmt.Errorf("create %s: %w", abs, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		ws.removeMade()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("another capstan dev is using %s", abs)
		}
		return fmt.Errorf("lock %s: %w", abs, err)
	}
	// The run that held the lock before may have removed the file after
	// this one opened it: then the lock is on a file nobody sees.
	if !sameFile(f, abs) {
		f.Close()
		ws.removeMade()
		return fmt.Errorf("another capstan dev is using %s", abs)
	}
	ws.lock, ws.Kubeconfig = f, abs
	return nil
}

func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

// mkdirAllMade creates dir and its missing parents and returns those it
// created, deepest first.
func mkdirAllMade(dir string) ([]string, error) {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
		missing = append(missing, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	return missing, nil
}

// WriteKubeconfig writes a kubeconfig with one context per cluster, the
// first current, each defaulting to the demo's namespace so that kubectl
// and `capstan status` show the demo without -n.
func (ws *devWorkspace) WriteKubeconfig(clusters []devKubeContext) error {
	cfg := clientcmdapi.NewConfig()
	for _, c := range clusters {
		cfg.Clusters[c.Name] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData}
		cfg.AuthInfos[c.Name] = &clientcmdapi.AuthInfo{Token: c.Config.BearerToken}
		cfg.Contexts[c.Name] = &clientcmdapi.Context{Cluster: c.Name, AuthInfo: c.Name, Namespace: devNamespace}
	}
	cfg.CurrentContext = clusters[0].Name
	content, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("write the kubeconfig %s: %w", ws.Kubeconfig, err)
	}
	if ws.lock == nil {
		return os.WriteFile(ws.Kubeconfig, content, 0o600)
	}
	// Written through the locked file: the path stays the same inode.
	if err := ws.lock.Truncate(0); err != nil {
		return fmt.Errorf("write the kubeconfig %s: %w", ws.Kubeconfig, err)
	}
	if _, err := ws.lock.WriteAt(content, 0); err != nil {
		return fmt.Errorf("write the kubeconfig %s: %w", ws.Kubeconfig, err)
	}
	return nil
}

// devKubeContext is one cluster of the kubeconfig.
type devKubeContext struct {
	Name   string
	Config *rest.Config
}

// Close removes the kubeconfig, the directories made for it when empty,
// and the workspace.
func (ws *devWorkspace) Close() error {
	var errs []error
	if ws.lock != nil {
		// Removed before the lock is released: a run that opened the file
		// meanwhile and gets the lock next sees that it is gone (sameFile).
		if err := os.Remove(ws.Kubeconfig); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove the kubeconfig: %w", err))
		}
		ws.lock.Close()
		ws.lock = nil
		ws.removeMade()
	}
	if err := os.RemoveAll(ws.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove the dev workspace: %w", err))
	}
	return errors.Join(errs...)
}

// removeMade removes the directories made for the kubeconfig; one that
// another run put a file into stays.
func (ws *devWorkspace) removeMade() {
	for _, d := range ws.made {
		if os.Remove(d) != nil {
			break
		}
	}
	ws.made = nil
}

// sweepDevWorkspaces removes the workspaces in tmp of runs whose process
// is gone: one killed with SIGKILL could not remove its own (its control
// plane died with it).
func sweepDevWorkspaces(tmp string) {
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), devWorkspacePrefix) {
			continue
		}
		dir := filepath.Join(tmp, e.Name())
		pid, err := os.ReadFile(filepath.Join(dir, "pid"))
		if err != nil {
			continue // being created, or not ours
		}
		if n, err := strconv.Atoi(strings.TrimSpace(string(pid))); err == nil && !processAlive(n) {
			os.RemoveAll(dir)
		}
	}
}

// processAlive reports whether a process with this id exists (a reused
// id counts as alive: the sweep then leaves a directory rather than
// removing a live one).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// devKubeconfigHint is the lines that tell how to use the kubeconfig.
func devKubeconfigHint(ws *devWorkspace, contexts []string) []string {
	lines := []string{fmt.Sprintf("kubeconfig %s (context %s, namespace %s); in another shell:", ws.Kubeconfig, contexts[0], devNamespace)}
	if ws.Fallback != "" {
		lines[0] = fmt.Sprintf("kubeconfig %s, not the usual path: %s; context %s, namespace %s; in another shell:", ws.Kubeconfig, ws.Fallback, contexts[0], devNamespace)
	}
	lines = append(lines, "    export KUBECONFIG="+shellQuote(ws.Kubeconfig),
		"    kubectl get clusterdeployments; capstan status")
	if len(contexts) > 1 {
		lines = append(lines, "    kubectl --context "+strings.Join(contexts[1:], ", ")+" get clusterdeployments")
	}
	return lines
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && !slices.ContainsFunc([]rune(s), func(r rune) bool {
		return !(r == '/' || r == '.' || r == '-' || r == '_' || r == ':' || r == '+' || r == ',' || r == '@' ||
			(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// node is the opt-in worker of an Env: containerd, kube-scheduler and a
// kubelet. Everything it starts lives under dir and, for processes the
// kubelet starts, under the cgroup cgroupRoot of every controller.
type node struct {
	name       string
	dir        string
	cgroupRoot string // "/capstan-testenv-<id>"
	socket     string // containerd's gRPC socket

	containerd, scheduler, kubelet *process
}

// nodeTools are the programs the node needs from the system: Debian's
// containerd package has all three.
var nodeTools = []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc"}

// CheckNode says whether this machine can run the node: containerd, its
// runc shim, ctr and runc on PATH (`make tools` installs Debian's
// containerd), root, and cgroups to put pods in.
func CheckNode(ctx context.Context) error {
	var errs []error
	for _, t := range nodeTools {
		if _, err := exec.LookPath(t); err != nil {
			errs = append(errs, fmt.Errorf("%s not found on PATH", t))
		}
	}
	if len(errs) > 0 {
		errs = append(errs, errors.New("install them with `make tools` (Debian package containerd)"))
	}
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("the node runs a kubelet and containerd, which need root"))
	}
	if _, err := os.Stat("/sys/fs/cgroup"); err != nil {
		errs = append(errs, fmt.Errorf("no cgroup filesystem: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("testenv node: %w", err)
	}
	return ctx.Err()
}

// NodeName is the name the node registered with, "" without a node.
func (e *Env) NodeName() string {
	if e.node == nil {
		return ""
	}
	return e.node.name
}

// PodAPIServer is where a pod on the node reaches kube-apiserver: the node
// has no kube-proxy, so the kubernetes Service's address leads nowhere, and
// host-network pods set KUBERNETES_SERVICE_HOST and _PORT to this instead.
// The serving certificate covers 127.0.0.1.
func (e *Env) PodAPIServer() (host string, port int) {
	u := strings.TrimPrefix(e.apiServerURL, "https://")
	h, p, _ := strings.Cut(u, ":")
	port, _ = strconv.Atoi(p)
	return h, port
}

// startNode starts containerd, kube-scheduler and the kubelet, and returns
// once the node is registered and the pause image is in containerd.
func (e *Env) startNode(ctx context.Context) error {
	if err := CheckNode(ctx); err != nil {
		return err
	}
	sweepStaleNodes(e.logf)
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	suffix := hex.EncodeToString(id)
	n := &node{
		name:       "capstan-node-" + suffix,
		dir:        filepath.Join(e.Dir, "node"),
		cgroupRoot: "/" + cgroupPrefix + strconv.Itoa(os.Getpid()) + "-" + suffix,
	}
	e.node = n
	begin := time.Now()
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return fmt.Errorf("start node: %w", err)
	}
	// Tells a later run whose node this was, should this process die
	// without Stop.
	if err := os.WriteFile(filepath.Join(n.dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("start node: %w", err)
	}
	if err := e.startContainerd(ctx); err != nil {
		return err
	}
	pause, err := pauseImage(ctx, e.binDir, e.progress)
	if err != nil {
		return err
	}
	if err := e.ImportImage(ctx, pause); err != nil {
		return err
	}
	e.logf("containerd ready after %s", since(begin))
	if err := e.startScheduler(ctx); err != nil {
		return err
	}
	if err := e.startKubelet(ctx); err != nil {
		return err
	}
	e.logf("kubelet registered node %s after %s", n.name, since(begin))
	return nil
}

// ImportImage makes the images of an OCI layout or docker-save tarball
// available on the node, under the names the tarball gives them, for pods
// with imagePullPolicy Never or IfNotPresent.
func (e *Env) ImportImage(ctx context.Context, tarPath string) error {
	if e.node == nil {
		return errors.New("import image: the env has no node (Options.Node)")
	}
	out, err := e.node.ctr(ctx, "images", "import", "--all-platforms", tarPath)
	if err != nil {
		return fmt.Errorf("import image %s: %w", tarPath, err)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		e.logf("imported %s", strings.TrimSpace(line))
	}
	return nil
}

// PodLogs returns what the container of a pod on the node printed, read
// from the kubelet's log files: the API server cannot reach this kubelet
// for `kubectl logs`, because a kubelet refuses to publish a loopback
// address as the node's, and the node has no other address on purpose.
func (e *Env) PodLogs(namespace, pod, container string) (string, error) {
	if e.node == nil {
		return "", errors.New("pod logs: the env has no node (Options.Node)")
	}
	files, err := filepath.Glob(filepath.Join(e.node.dir, "pod-logs", namespace+"_"+pod+"_*", container, "*.log"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("pod logs: no log of container %s of pod %s/%s on the node", container, namespace, pod)
	}
	sort.Strings(files)
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("pod logs: %w", err)
		}
		// CRI log lines: "<time> <stream> <P|F> <text>".
		for _, line := range strings.SplitAfter(string(data), "\n") {
			if parts := strings.SplitN(line, " ", 4); len(parts) == 4 {
				b.WriteString(parts[3])
			}
		}
	}
	return b.String(), nil
}

// ctr runs containerd's CLI against the node's containerd, in the k8s.io
// namespace the CRI plugin uses.
func (n *node) ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.socket, "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// waitForNode waits until the node object exists with a heartbeat.
func (e *Env) waitForNode(ctx context.Context) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		nd, err := e.client.CoreV1().Nodes().Get(ctx, e.node.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, fmt.Errorf("node %s not registered yet", e.node.name)
		}
		if err != nil {
			return false, err
		}
		for _, c := range nd.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return true, nil
			}
		}
		return false, fmt.Errorf("node %s has no Ready condition yet", e.node.name)
	}
}

// httpGetOK is a readiness check for a plain-http health endpoint.
func httpGetOK(url string) func(context.Context) (bool, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	return func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}
}

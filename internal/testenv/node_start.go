package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/capstan-dev/capstan/internal/image"
)

// PauseImage is the sandbox image of the node's pods, imported at start.
const PauseImage = "capstan.dev/testenv/pause:1"

// containerdConfig is the node's containerd configuration: everything under
// the env's directory, the CRI plugin on, no network plugin (pods use the
// host's network). restrict_oom_score_adj keeps runc from raising a
// container's OOM score adjustment below its parent's, which needs
// CAP_SYS_RESOURCE; without it every sandbox fails with "can't get final
// child's PID from pipe: EOF" where that capability is missing.
const containerdConfig = `version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[6]q
`

func (e *Env) startContainerd(ctx context.Context) error {
	n := e.node
	dir := filepath.Join(n.dir, "containerd")
	if err := os.MkdirAll(filepath.Join(dir, "cni"), 0o755); err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	n.socket = filepath.Join(dir, "containerd.sock")
	cfg := fmt.Sprintf(containerdConfig, filepath.Join(dir, "root"), filepath.Join(dir, "state"),
		n.socket, filepath.Join(dir, "ttrpc.sock"), PauseImage, filepath.Join(dir, "cni"))
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	p, err := startProcess(ctx, e.Dir, containerdName, bin, []string{"--config", cfgPath})
	if err != nil {
		return err
	}
	n.containerd = p
	return p.waitUntil(ctx, func(ctx context.Context) (bool, error) {
		_, err := n.ctr(ctx, "version")
		return err == nil, err
	})
}

// startScheduler starts kube-scheduler, serving /healthz with the env's
// certificate like kube-controller-manager.
func (e *Env) startScheduler(ctx context.Context) error {
	p, err := startOnFreePorts(ctx, 1, func(ports []int) (*process, error) {
		url := "https://127.0.0.1:" + strconv.Itoa(ports[0])
		args := []string{
			"--kubeconfig=" + e.KubeconfigPath,
			"--authentication-kubeconfig=" + e.KubeconfigPath,
			"--authorization-kubeconfig=" + e.KubeconfigPath,
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(ports[0]),
			"--tls-cert-file=" + e.pki.servingCert,
			"--tls-private-key-file=" + e.pki.servingKey,
			"--leader-elect=false",
			"--profiling=false",
		}
		return e.startHealthy(ctx, schedulerName, args, url+"/healthz", "")
	})
	if err != nil {
		return err
	}
	e.node.scheduler = p
	return nil
}

// kubeletConfig is the KubeletConfiguration of the node. The host is cgroup
// v1 and may have swap; the kubelet serves on loopback with the env's
// certificate and lets anyone in (only the API server talks to it); its
// pods live under their own cgroup root so Stop can find every process;
// eviction and image garbage collection are off, so a nearly full disk
// never evicts a test's pods.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %[1]d
healthzBindAddress: 127.0.0.1
healthzPort: %[2]d
readOnlyPort: 0
tlsCertFile: %[3]q
tlsPrivateKeyFile: %[4]q
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: %[5]q
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%[6]s
podLogsDir: %[7]q
resolvConf: %[8]q
evictionHard: {memory.available: "1%%", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
registerNode: true
serializeImagePulls: false
`

func (e *Env) startKubelet(ctx context.Context) error {
	n := e.node
	dir := filepath.Join(n.dir, "kubelet")
	for _, d := range []string{dir, filepath.Join(n.dir, "pod-logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("start kubelet: %w", err)
		}
	}
	if err := createCgroups(n.cgroupRoot); err != nil {
		return fmt.Errorf("start kubelet: %w", err)
	}
	resolv := filepath.Join(n.dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		return fmt.Errorf("start kubelet: %w", err)
	}
	p, err := startOnFreePorts(ctx, 2, func(ports []int) (*process, error) {
		cfg := fmt.Sprintf(kubeletConfig, ports[0], ports[1], e.pki.servingCert, e.pki.servingKey,
			n.cgroupRoot, n.socket, filepath.Join(n.dir, "pod-logs"), resolv)
		cfgPath := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			return nil, fmt.Errorf("start kubelet: %w", err)
		}
		args := []string{
			"--config=" + cfgPath,
			"--kubeconfig=" + e.KubeconfigPath,
			"--root-dir=" + filepath.Join(dir, "root"),
			"--cert-dir=" + filepath.Join(dir, "pki"),
			"--hostname-override=" + n.name,
			"--node-ip=127.0.0.1",
			"--v=1",
		}
		p, err := startProcess(ctx, e.Dir, kubeletName, filepath.Join(e.binDir, kubeletName), args)
		if err != nil {
			return nil, err
		}
		if err := p.waitUntil(ctx, httpGetOK("http://127.0.0.1:"+strconv.Itoa(ports[1])+"/healthz")); err != nil {
			p.stop()
			return nil, err
		}
		return p, nil
	})
	if err != nil {
		return err
	}
	n.kubelet = p
	return p.waitUntil(ctx, e.waitForNode(ctx))
}

// pauseImage returns the OCI tarball of the pause program for this
// machine, building it into binDir when the cached one is missing or was
// built from other source.
func pauseImage(ctx context.Context, binDir string, progress io.Writer) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", fmt.Errorf("pause image: %w", err)
	}
	src, err := os.ReadFile(filepath.Join(root, "internal", "testenv", "pause", "main.go"))
	if err != nil {
		return "", fmt.Errorf("pause image: %w", err)
	}
	sum := sha256.Sum256(src)
	path := filepath.Join(binDir, "pause-"+runtime.GOARCH+"-"+hex.EncodeToString(sum[:6])+".tar")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	idx, err := image.Build(ctx, image.Options{
		Dir:       root,
		Package:   "./internal/testenv/pause",
		Binary:    "pause",
		Platforms: []string{"linux/" + runtime.GOARCH},
		LDFlags:   "-s -w",
		Created:   time.Unix(0, 0),
		Progress:  progress,
	})
	if err != nil {
		return "", fmt.Errorf("pause image: %w", err)
	}
	if err := image.WriteOCITarball(path, idx, PauseImage); err != nil {
		return "", fmt.Errorf("pause image: %w", err)
	}
	return path, nil
}

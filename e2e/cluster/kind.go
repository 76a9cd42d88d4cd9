package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	kindcluster "sigs.k8s.io/kind/pkg/cluster"
	"sigs.k8s.io/kind/pkg/cluster/nodeutils"

	"github.com/capstan-dev/capstan/internal/image"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// DefaultKindNodeImage is the node image kind clusters start from unless
// CAPSTAN_KIND_NODE_IMAGE names another: Kubernetes v1.35, the version the
// local backend builds.
const DefaultKindNodeImage = "kindest/node:v1.35.0"

// The ways Check finds a machine unfit for kind, for errors.Is.
var (
	ErrNoDockerCLI       = errors.New("the docker CLI is not installed")
	ErrDockerUnreachable = errors.New("cannot reach the Docker daemon")
	ErrPrivilegedRefused = errors.New("the Docker daemon refuses privileged containers, which kind nodes need")
	ErrNodeImageMissing  = errors.New("the kind node image is not present")
)

// Kind is the backend that runs a kind cluster in Docker.
type Kind struct {
	// NodeImage defaults to $CAPSTAN_KIND_NODE_IMAGE, else DefaultKindNodeImage.
	NodeImage string
	// Progress receives start-up lines; nil means stderr.
	Progress io.Writer
}

var _ Backend = (*Kind)(nil)

// Name is "kind".
func (*Kind) Name() string { return "kind" }

func (k *Kind) nodeImage() string {
	if k.NodeImage != "" {
		return k.NodeImage
	}
	if img := os.Getenv("CAPSTAN_KIND_NODE_IMAGE"); img != "" {
		return img
	}
	return DefaultKindNodeImage
}

// dockerHost says which daemon the docker CLI talks to.
func dockerHost() string {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return h
	}
	return "unix:///var/run/docker.sock"
}

// Check finds out, before anything is created, whether kind can run here:
// the docker CLI, a daemon that answers, one that runs privileged
// containers (kind's nodes are privileged), and the node image present
// (nothing is pulled). The error says which step failed and what to do.
func (k *Kind) Check(ctx context.Context) error {
	if _, err := exec.LookPath("docker"); err != nil {
		return fmt.Errorf("kind backend: %w (apt-get install docker.io), or use the local backend (%s=local, the default)", ErrNoDockerCLI, EnvBackend)
	}
	if out, err := docker(ctx, "version", "--format", "{{.Server.Version}}"); err != nil {
		return fmt.Errorf("kind backend: %w at %s: %s; start it (systemctl start docker, or dockerd &) or use the local backend (%s=local): %w",
			ErrDockerUnreachable, dockerHost(), out, EnvBackend, err)
	}
	if err := checkPrivileged(ctx); err != nil {
		return err
	}
	if out, err := docker(ctx, "image", "inspect", "--format", "{{.Id}}", k.nodeImage()); err != nil {
		return fmt.Errorf("kind backend: %w: %s (%s); `docker pull %s` where there is network, or set CAPSTAN_KIND_NODE_IMAGE: %w",
			ErrNodeImageMissing, k.nodeImage(), out, k.nodeImage(), err)
	}
	return nil
}

// checkPrivileged starts a privileged container from a probe image built
// here (the test node's pause program), so no registry is needed.
func checkPrivileged(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "capstan-kind-probe-")
	if err != nil {
		return fmt.Errorf("kind backend: %w", err)
	}
	defer os.RemoveAll(dir)
	root, err := testenv.RepoRoot()
	if err != nil {
		return fmt.Errorf("kind backend: probe image: %w", err)
	}
	idx, err := image.Build(ctx, image.Options{
		Dir: root, Package: "./internal/testenv/pause", Binary: "pause",
		Platforms: []string{"linux/" + runtime.GOARCH}, LDFlags: "-s -w",
	})
	if err != nil {
		return fmt.Errorf("kind backend: probe image: %w", err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return fmt.Errorf("kind backend: probe image: %w", err)
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		return fmt.Errorf("kind backend: probe image: %w", err)
	}
	const probeRef = "capstan.dev/kind-probe:1"
	tag, _ := name.NewTag(probeRef)
	archive := filepath.Join(dir, "probe.tar")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		return fmt.Errorf("kind backend: probe image: %w", err)
	}
	if out, err := docker(ctx, "load", "--input", archive); err != nil {
		return fmt.Errorf("kind backend: docker load of the probe image: %s: %w", out, err)
	}
	out, err := docker(ctx, "run", "--detach", "--rm", "--privileged", probeRef)
	if err != nil {
		return fmt.Errorf("kind backend: %w: `docker run --privileged` said: %s; use the local backend (%s=local, the default) or a machine whose Docker runs privileged containers: %w",
			ErrPrivilegedRefused, out, EnvBackend, err)
	}
	_, _ = docker(context.WithoutCancel(ctx), "rm", "--force", strings.TrimSpace(out))
	return nil
}

// docker runs the docker CLI and returns its trimmed output.
func docker(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

// Start creates a one-node kind cluster and waits until it is ready.
func (k *Kind) Start(ctx context.Context) (Cluster, error) {
	if err := k.Check(ctx); err != nil {
		return nil, err
	}
	progress := k.Progress
	if progress == nil {
		progress = os.Stderr
	}
	id := make([]byte, 3)
	_, _ = rand.Read(id)
	c := &kindCluster{name: "capstan-e2e-" + hex.EncodeToString(id), provider: kindcluster.NewProvider(kindcluster.ProviderWithDocker())}
	dir, err := os.MkdirTemp("", c.name+"-")
	if err != nil {
		return nil, err
	}
	c.kubeconfig = filepath.Join(dir, "kubeconfig")
	fmt.Fprintf(progress, "kind: creating cluster %s from %s\n", c.name, k.nodeImage())
	err = c.provider.Create(c.name, kindcluster.CreateWithNodeImage(k.nodeImage()),
		kindcluster.CreateWithWaitForReady(3*time.Minute), kindcluster.CreateWithKubeconfigPath(c.kubeconfig),
		kindcluster.CreateWithDisplayUsage(false), kindcluster.CreateWithDisplaySalutation(false))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("kind backend: create cluster %s: %w", c.name, err), c.Stop())
	}
	if c.config, err = clientcmd.BuildConfigFromFlags("", c.kubeconfig); err != nil {
		return nil, errors.Join(fmt.Errorf("kind backend: %w", err), c.Stop())
	}
	gw, err := docker(ctx, "network", "inspect", "kind", "--format", "{{range .IPAM.Config}}{{if .Gateway}}{{.Gateway}} {{end}}{{end}}")
	if err != nil {
		return nil, errors.Join(fmt.Errorf("kind backend: the kind network's gateway: %s: %w", gw, err), c.Stop())
	}
	c.hostAddress = strings.Fields(gw + " ")[0]
	return c, nil
}

type kindCluster struct {
	name, kubeconfig, hostAddress string
	provider                      *kindcluster.Provider
	config                        *rest.Config
}

func (c *kindCluster) Config() *rest.Config              { return rest.CopyConfig(c.config) }
func (c *kindCluster) KubeconfigPath() string            { return c.kubeconfig }
func (c *kindCluster) PodAPIServer() (string, int, bool) { return "", 0, false }
func (c *kindCluster) HostNetwork() bool                 { return false }
func (c *kindCluster) HostAddress() string               { return c.hostAddress }

func (c *kindCluster) LoadImage(ctx context.Context, tarPath string) error {
	nodes, err := c.provider.ListInternalNodes(c.name)
	if err != nil {
		return fmt.Errorf("kind backend: load image: %w", err)
	}
	for _, n := range nodes {
		f, err := os.Open(tarPath)
		if err != nil {
			return fmt.Errorf("kind backend: load image: %w", err)
		}
		err = nodeutils.LoadImageArchive(n, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("kind backend: load image into %s: %w", n, err)
		}
	}
	return ctx.Err()
}

func (c *kindCluster) PodLogs(ctx context.Context, namespace, pod, container string) (string, error) {
	cs, err := kubernetes.NewForConfig(c.config)
	if err != nil {
		return "", err
	}
	data, err := cs.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	return string(data), err
}

func (c *kindCluster) Stop() error {
	if os.Getenv("CAPSTAN_KIND_KEEP") == "1" {
		return nil
	}
	return c.provider.Delete(c.name, c.kubeconfig)
}

package cluster

import (
	"context"
	"io"
	"os"

	"k8s.io/client-go/rest"

	"github.com/capstan-dev/capstan/internal/testenv"
)

// Local is the backend that runs a cluster on this machine: internal/testenv
// with its node (containerd, kubelet, kube-scheduler), so pods really run.
// The node has no CNI: pods run with host networking and reach the API
// server on 127.0.0.1.
type Local struct {
	// Progress receives start-up lines; nil means stderr.
	Progress io.Writer
}

var _ Backend = (*Local)(nil)

// Name is "local".
func (*Local) Name() string { return "local" }

// Check verifies what testenv cannot build itself: containerd and runc,
// which `make tools` installs.
func (*Local) Check(ctx context.Context) error { return testenv.CheckNode(ctx) }

// Start starts the control plane and the node.
func (l *Local) Start(ctx context.Context) (Cluster, error) {
	progress := l.Progress
	if progress == nil {
		progress = os.Stderr
	}
	env, err := testenv.Start(ctx, testenv.Options{ControllerManager: true, Node: true, Progress: progress})
	if err != nil {
		return nil, err
	}
	return &localCluster{env: env}, nil
}

type localCluster struct{ env *testenv.Env }

func (c *localCluster) Config() *rest.Config   { return rest.CopyConfig(c.env.Config) }
func (c *localCluster) KubeconfigPath() string { return c.env.KubeconfigPath }
func (c *localCluster) HostNetwork() bool      { return true }
func (c *localCluster) HostAddress() string    { return "127.0.0.1" }
func (c *localCluster) Stop() error            { return c.env.Stop() }
func (c *localCluster) LoadImage(ctx context.Context, tarPath string) error {
	return c.env.ImportImage(ctx, tarPath)
}

func (c *localCluster) PodLogs(_ context.Context, namespace, pod, container string) (string, error) {
	return c.env.PodLogs(namespace, pod, container)
}

func (c *localCluster) PodAPIServer() (string, int, bool) {
	host, port := c.env.PodAPIServer()
	return host, port, true
}

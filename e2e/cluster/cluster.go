// Package cluster gives the end-to-end suites a Kubernetes cluster to install
// Capstan into, from one of two backends: "local" (internal/testenv: real
// etcd, kube-apiserver, kube-controller-manager and, for pods that really
// run, kube-scheduler, a kubelet and containerd on this machine) and "kind"
// (a kind cluster in Docker, for machines where Docker may run privileged
// containers). The suites are written once against Cluster and run on
// either; CAPSTAN_E2E_BACKEND picks one.
package cluster

import (
	"context"
	"fmt"
	"os"

	"k8s.io/client-go/rest"
)

// Cluster is a running cluster whose nodes run pods.
type Cluster interface {
	// Config authenticates as a cluster admin.
	Config() *rest.Config
	// KubeconfigPath is a kubeconfig file for the same admin.
	KubeconfigPath() string
	// LoadImage makes the images of an OCI image layout tarball (what
	// `make image` writes) available to the nodes without a registry,
	// under the names its index annotates.
	LoadImage(ctx context.Context, tarPath string) error
	// PodAPIServer is the address pods use to reach the API server when
	// the cluster has no Service network (the local backend runs pods with
	// host networking and no kube-proxy): host and port for
	// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT. ok is false
	// when the in-cluster defaults work.
	PodAPIServer() (host string, port int, ok bool)
	// HostAddress is the address at which pods reach servers the tests
	// run on this machine (a git server): 127.0.0.1 for host-network pods,
	// the Docker network's gateway for kind.
	HostAddress() string
	// PodLogs returns what a container printed.
	PodLogs(ctx context.Context, namespace, pod, container string) (string, error)
	// HostNetwork says whether Capstan's pods must run with host networking
	// (no CNI on the node), which also means one pod per port.
	HostNetwork() bool
	// Stop deletes the cluster and everything it ran.
	Stop() error
}

// Backend creates clusters.
type Backend interface {
	// Name is "local" or "kind".
	Name() string
	// Check says, before anything is created, whether this machine can run
	// the backend, and if not exactly why (an error to report, never a
	// reason to skip silently).
	Check(ctx context.Context) error
	// Start creates a cluster; ctx bounds the start-up only.
	Start(ctx context.Context) (Cluster, error)
}

// EnvBackend names the environment variable that picks the backend.
const EnvBackend = "CAPSTAN_E2E_BACKEND"

// FromEnv returns the backend CAPSTAN_E2E_BACKEND names: "local" (the
// default) or "kind".
func FromEnv() (Backend, error) {
	switch name := os.Getenv(EnvBackend); name {
	case "", "local":
		return &Local{}, nil
	case "kind":
		return &Kind{}, nil
	default:
		return nil, fmt.Errorf("%s=%q: want local or kind", EnvBackend, name)
	}
}

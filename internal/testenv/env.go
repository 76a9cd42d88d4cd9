package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options for Start.
type Options struct {
	// BinDir holds etcd, kube-apiserver and kube-controller-manager. Empty
	// means the directory EnsureBinaries returns, building them if needed.
	BinDir string
	// CRDDirs are directories of CRD YAML, or single files, installed before
	// Start returns; see InstallCRDs.
	CRDDirs []string
	// ControllerManager also starts kube-controller-manager with its default
	// controllers (namespace deletion, garbage collection, PDB status, ...).
	ControllerManager bool
	// Node also starts containerd, kube-scheduler and a kubelet (and
	// implies ControllerManager), so that pods really run: with host
	// networking only, as the node has no CNI. See CheckNode for what the
	// machine needs, and the package documentation for what pods must
	// tolerate.
	Node bool
	// Providers also runs the real Cluster API and Metal3 controllers
	// (Providers: core, kubeadm bootstrap and control plane, CAPM3, IPAM
	// and the BareMetal Operator in test mode) as processes, built from
	// their Go modules by e2e/providers/build.sh, after installing their
	// CRDs with conversion webhooks and their admission webhooks served on
	// 127.0.0.1, as a release does in a real management cluster.
	Providers bool
	// Progress receives one line per start-up step and the output of a
	// binary build. Nil discards it.
	Progress io.Writer
	// Dir holds data, certificates, the kubeconfig and the logs. Empty means
	// a new temporary directory, removed by Stop; a given Dir is kept.
	Dir string
}

// Env is a running control plane. Stop it when done.
type Env struct {
	// Config authenticates as an admin in group system:masters, with QPS and
	// Burst high enough for tests that apply many objects.
	Config *rest.Config
	// KubeconfigPath is a kubeconfig for the same admin, usable by kubectl.
	KubeconfigPath string
	// Dir holds data, certificates, the kubeconfig and <binary>.log files.
	Dir string

	binDir       string
	removeDir    bool
	progress     io.Writer
	pki          *pki
	apiServerURL string
	etcdURL      string
	client       kubernetes.Interface

	etcd, apiServer, controllerManager *process
	node                               *node
	providers                          []*process
}

// Start starts etcd, kube-apiserver and, if asked, kube-controller-manager
// on free loopback ports, installs the CRDs and returns once everything is
// ready. ctx bounds the start-up only, including a build of the binaries;
// the processes run until Stop. On error nothing is left running.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	begin := time.Now()
	e := &Env{binDir: opts.BinDir, Dir: opts.Dir, progress: opts.Progress}
	if e.progress == nil {
		e.progress = io.Discard
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Stop())
		}
	}()

	if e.binDir == "" {
		if e.binDir, err = EnsureBinaries(ctx, e.progress); err != nil {
			return nil, err
		}
	}
	if e.Dir == "" {
		if e.Dir, err = os.MkdirTemp("", "capstan-testenv-"); err != nil {
			return nil, fmt.Errorf("create testenv dir: %w", err)
		}
		e.removeDir = true
	} else if err := os.MkdirAll(e.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create testenv dir: %w", err)
	}
	if e.Dir, err = filepath.Abs(e.Dir); err != nil {
		return nil, fmt.Errorf("resolve testenv dir: %w", err)
	}
	if e.pki, err = newPKI(filepath.Join(e.Dir, "pki")); err != nil {
		return nil, fmt.Errorf("create credentials: %w", err)
	}

	etcdURL, err := e.startEtcd(ctx)
	if err != nil {
		return nil, err
	}
	e.logf("etcd ready at %s after %s", etcdURL, since(begin))

	if err := e.startAPIServer(ctx, etcdURL); err != nil {
		return nil, err
	}
	e.logf("kube-apiserver ready at %s after %s", e.apiServerURL, since(begin))

	if err := e.writeConfig(); err != nil {
		return nil, err
	}
	if opts.ControllerManager || opts.Node {
		if err := e.startControllerManager(ctx); err != nil {
			return nil, err
		}
		e.logf("kube-controller-manager ready after %s", since(begin))
	}
	if opts.Node {
		if err := e.startNode(ctx); err != nil {
			return nil, err
		}
	}
	if len(opts.CRDDirs) > 0 {
		if err := InstallCRDs(ctx, e.Config, opts.CRDDirs...); err != nil {
			return nil, err
		}
		e.logf("CRDs established after %s", since(begin))
	}
	if opts.Providers {
		if err := e.startProviders(ctx); err != nil {
			return nil, err
		}
	}
	e.logf("control plane ready in %s, kubeconfig %s", since(begin), e.KubeconfigPath)
	return e, nil
}

// Stop stops the node if there is one (see stopNode), then the
// providers, then kube-controller-manager, then kube-apiserver, then etcd (in the
// other order kube-apiserver hangs for a minute retrying etcd) and removes
// Dir if Start created it. It is safe to call more than once.
func (e *Env) Stop() error {
	// The node goes first: it deletes its pods through the API server.
	errs := []error{e.stopNode(), e.stopProviders()}
	e.node = nil
	for _, p := range []*process{e.controllerManager, e.apiServer, e.etcd} {
		if p != nil {
			errs = append(errs, p.stop())
		}
	}
	if e.removeDir && e.Dir != "" {
		if err := os.RemoveAll(e.Dir); err != nil {
			errs = append(errs, fmt.Errorf("remove testenv dir: %w", err))
		}
	}
	return errors.Join(errs...)
}

// writeConfig builds Config and the clientset and writes the kubeconfig.
func (e *Env) writeConfig() error {
	e.Config = &rest.Config{
		Host:            e.apiServerURL,
		BearerToken:     e.pki.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.pki.caPEM},
		QPS:             500,
		Burst:           1000,
	}
	client, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	e.client = client

	const name = "capstan-testenv"
	kubeconfig := clientcmdapi.NewConfig()
	kubeconfig.Clusters[name] = &clientcmdapi.Cluster{Server: e.apiServerURL, CertificateAuthorityData: e.pki.caPEM}
	kubeconfig.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: e.pki.token}
	kubeconfig.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name, Namespace: "default"}
	kubeconfig.CurrentContext = name
	e.KubeconfigPath = filepath.Join(e.Dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kubeconfig, e.KubeconfigPath); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// LogPath returns the log file of a binary: "etcd", "kube-apiserver" or
// "kube-controller-manager".
func (e *Env) LogPath(binary string) string {
	return filepath.Join(e.Dir, binary+".log")
}

func (e *Env) logf(format string, args ...any) {
	fmt.Fprintf(e.progress, "testenv: "+format+"\n", args...)
}

func since(t time.Time) time.Duration {
	return time.Since(t).Round(time.Millisecond)
}

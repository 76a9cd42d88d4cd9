package testenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Names of the binaries, which are also the names of their log files.
const (
	etcdName              = "etcd"
	apiServerName         = "kube-apiserver"
	controllerManagerName = "kube-controller-manager"
	schedulerName         = "kube-scheduler"
	kubeletName           = "kubelet"
	containerdName        = "containerd"
)

// serviceCIDR is the Service IP range; serviceIP is the first address, which
// the kubernetes Service takes and the serving certificate names.
var (
	serviceCIDR = "10.0.0.0/24"
	serviceIP   = net.IPv4(10, 0, 0, 1)
)

// portAttempts is how often a binary is started on fresh ports when the
// chosen ones were taken before it could bind them.
const portAttempts = 3

// startOnFreePorts runs start with n free loopback ports, trying again on
// other ports when start fails with errAddrInUse.
func startOnFreePorts(ctx context.Context, n int, start func(ports []int) (*process, error)) (*process, error) {
	var errs []error
	for range portAttempts {
		ports, err := freePorts(n)
		if err != nil {
			return nil, err
		}
		p, err := start(ports)
		if err == nil || !errors.Is(err, errAddrInUse) || ctx.Err() != nil {
			return p, err
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// freePorts returns n distinct ports that were free on 127.0.0.1 a moment
// ago. Holding all listeners until the end keeps the kernel from handing out
// the same port twice.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startEtcd starts a single-member etcd on loopback and waits until it
// reports healthy. It returns the client URL. etcd serves TLS with the env's
// certificate, so the health check cannot be answered by another test's etcd
// that happens to have taken the port.
func (e *Env) startEtcd(ctx context.Context) (string, error) {
	var clientURL string
	dataDir := filepath.Join(e.Dir, "etcd-data")
	p, err := startOnFreePorts(ctx, 2, func(ports []int) (*process, error) {
		// A failed attempt may have written a membership with other ports.
		if err := os.RemoveAll(dataDir); err != nil {
			return nil, fmt.Errorf("start etcd: clear data dir: %w", err)
		}
		clientURL = "https://127.0.0.1:" + strconv.Itoa(ports[0])
		peerURL := "http://127.0.0.1:" + strconv.Itoa(ports[1])
		args := []string{
			"--name=default",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + clientURL,
			"--advertise-client-urls=" + clientURL,
			"--cert-file=" + e.pki.servingCert,
			"--key-file=" + e.pki.servingKey,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=default=" + peerURL,
			"--initial-cluster-state=new",
			// The data is thrown away with the test run.
			"--unsafe-no-fsync=true",
		}
		return e.startHealthy(ctx, etcdName, args, clientURL+"/health", "")
	})
	if err != nil {
		return "", err
	}
	e.etcd = p
	return clientURL, nil
}

// startAPIServer starts kube-apiserver against etcdURL and waits until
// /readyz answers ok to the admin token.
func (e *Env) startAPIServer(ctx context.Context, etcdURL string) error {
	e.etcdURL = etcdURL
	p, err := startOnFreePorts(ctx, 1, func(ports []int) (*process, error) {
		e.apiServerURL = "https://127.0.0.1:" + strconv.Itoa(ports[0])
		return e.startHealthy(ctx, apiServerName, e.apiServerArgs(ports[0]), e.apiServerURL+"/readyz", e.pki.token)
	})
	if err != nil {
		return err
	}
	e.apiServer = p
	return nil
}

func (e *Env) apiServerArgs(port int) []string {
	return []string{
		"--etcd-servers=" + e.etcdURL,
		"--etcd-cafile=" + e.pki.caFile,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(e.Dir, "apiserver-certs"),
		"--tls-cert-file=" + e.pki.servingCert,
		"--tls-private-key-file=" + e.pki.servingKey,
		"--token-auth-file=" + e.pki.tokenAuthFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + e.pki.saKey,
		"--service-account-signing-key-file=" + e.pki.saKey,
		"--service-cluster-ip-range=" + serviceCIDR,
		// The default reconciler fails every few seconds, since endpoints
		// may not be loopback addresses; nothing runs in-cluster to use
		// the kubernetes Service anyway.
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		// The test node registers a hostname nothing resolves; logs,
		// exec and port-forward reach its kubelet on 127.0.0.1.
		"--kubelet-preferred-address-types=InternalIP",
		"--profiling=false",
	}
}

// StopAPIServer kills kube-apiserver, as a crash or an outage would (a
// graceful stop waits out the clients' watches), and leaves everything
// else running, etcd with its data included. RestartAPIServer brings it
// back at the same address.
func (e *Env) StopAPIServer() error {
	if e.apiServer == nil {
		return errors.New("stop kube-apiserver: not running")
	}
	err := e.apiServer.kill()
	e.apiServer = nil
	return err
}

// RestartAPIServer starts kube-apiserver again, at the address Config and
// the kubeconfig name, after StopAPIServer, and returns once it is ready.
func (e *Env) RestartAPIServer(ctx context.Context) error {
	if e.apiServer != nil {
		return errors.New("restart kube-apiserver: still running; call StopAPIServer first")
	}
	u, err := url.Parse(e.apiServerURL)
	if err != nil {
		return fmt.Errorf("restart kube-apiserver: %w", err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return fmt.Errorf("restart kube-apiserver: port of %s: %w", e.apiServerURL, err)
	}
	p, err := e.startHealthy(ctx, apiServerName, e.apiServerArgs(port), e.apiServerURL+"/readyz", e.pki.token)
	if err != nil {
		return fmt.Errorf("restart kube-apiserver on %s: %w", e.apiServerURL, err)
	}
	e.apiServer = p
	return nil
}

// startControllerManager starts kube-controller-manager with all default
// controllers and waits until its /healthz answers ok. It serves with the
// env's certificate, so the check cannot reach another test's process; it has
// no authentication kubeconfig because /healthz is open to anonymous users
// anyway, and looking up the in-cluster request-header CA only adds a way
// to fail.
func (e *Env) startControllerManager(ctx context.Context) error {
	p, err := startOnFreePorts(ctx, 1, func(ports []int) (*process, error) {
		url := "https://127.0.0.1:" + strconv.Itoa(ports[0])
		args := []string{
			"--kubeconfig=" + e.KubeconfigPath,
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(ports[0]),
			"--cert-dir=" + filepath.Join(e.Dir, "controller-manager-certs"),
			"--tls-cert-file=" + e.pki.servingCert,
			"--tls-private-key-file=" + e.pki.servingKey,
			"--leader-elect=false",
			"--controllers=*",
			"--service-account-private-key-file=" + e.pki.saKey,
			"--root-ca-file=" + e.pki.caFile,
			"--service-cluster-ip-range=" + serviceCIDR,
			"--profiling=false",
		}
		return e.startHealthy(ctx, controllerManagerName, args, url+"/healthz", "")
	})
	if err != nil {
		return err
	}
	e.controllerManager = p
	return nil
}

// startHealthy starts one binary of the bin dir and returns once its
// health endpoint answers 200; on any failure the process is stopped.
func (e *Env) startHealthy(ctx context.Context, name string, args []string, healthURL, token string) (*process, error) {
	p, err := startProcess(ctx, e.Dir, name, filepath.Join(e.binDir, name), args)
	if err != nil {
		return nil, err
	}
	client, err := e.httpClient()
	if err == nil {
		err = p.waitUntil(ctx, httpOK(client, healthURL, token))
	}
	if err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// httpClient returns a client that trusts the env's CA, for health checks.
func (e *Env) httpClient() (*http.Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(e.pki.caPEM) {
		return nil, errors.New("build health-check client: CA certificate does not parse")
	}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		DisableKeepAlives: true,
	}}, nil
}

// httpOK returns a readiness check that GETs url, with token as bearer token
// if set, and is ready on 200 OK.
func httpOK(client *http.Client, url, token string) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		// One slow request must not use up the caller's whole deadline.
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, fmt.Errorf("GET %s: %w", url, err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, err // a *url.Error, which names method and URL
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
		}
		return true, nil
	}
}

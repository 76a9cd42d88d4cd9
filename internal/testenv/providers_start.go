package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// webhookFieldManager owns the webhook configurations startProviders
// applies.
const webhookFieldManager = "capstan-testenv"

// startProviders installs the providers' CRDs with their conversion
// webhooks and their admission webhooks, all pointing at 127.0.0.1, and
// starts every provider in Providers, returning once each reports ready
// and serves its webhooks. On error the ones started are left in
// e.providers for Stop.
func (e *Env) startProviders(ctx context.Context) error {
	begin := time.Now()
	binDir, err := EnsureProviders(ctx, e.progress)
	if err != nil {
		return err
	}
	roots, err := providerModuleRoots(ctx)
	if err != nil {
		return fmt.Errorf("start providers: %w", err)
	}
	certDir := webhookCertDir(e.Dir)
	if err := e.writeWebhookCerts(certDir); err != nil {
		return err
	}
	ports, err := freePorts(3 * len(Providers))
	if err != nil {
		return err
	}
	portsOf := func(i int) providerPorts {
		return providerPorts{webhook: ports[3*i], health: ports[3*i+1], metrics: ports[3*i+2]}
	}

	var crds []crdDoc
	hooks := map[string][]webhookConfiguration{}
	var errs []error
	for i, p := range Providers {
		root := roots[p.Module]
		crdDir := filepath.Join(root, filepath.FromSlash(p.CRDDir))
		docs, err := readCRDs([]string{crdDir})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Name, err))
			continue
		}
		release, err := readCRDRelease(crdDir)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Name, err))
			continue
		}
		for _, d := range docs {
			if d, err = release.apply(d, webhookURL(portsOf(i).webhook, "/convert"), e.pki.caPEM); err != nil {
				errs = append(errs, err)
			}
			crds = append(crds, d)
		}
		manifests := filepath.Join(filepath.Dir(filepath.Dir(crdDir)), "webhook", "manifests.yaml")
		h, err := webhookConfigurations(manifests, p.Name, portsOf(i).webhook, e.pki.caPEM)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Name, err))
		}
		hooks[p.Name] = h
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("start providers: %w", err)
	}
	if err := installCRDDocs(ctx, e.Config, crds); err != nil {
		return fmt.Errorf("start providers: %w", err)
	}
	e.logf("provider CRDs installed after %s", since(begin))

	client, err := e.httpClient()
	if err != nil {
		return err
	}
	for i, p := range Providers {
		pp := portsOf(i)
		args, env := p.command(e, pp, certDir)
		proc, err := startProcess(ctx, e.Dir, p.Name, filepath.Join(binDir, p.Name), args, env...)
		if err != nil {
			return err
		}
		e.providers = append(e.providers, proc)
		health := "http://127.0.0.1:" + strconv.Itoa(pp.health) + "/readyz"
		if err := proc.waitUntil(ctx, allOf(httpOK(client, health, ""), tlsServes(client, pp.webhook))); err != nil {
			return err
		}
		// Every webhook fails closed: register them once their server
		// answers, as a release's readiness gate does.
		if err := e.applyWebhooks(ctx, hooks[p.Name]); err != nil {
			return fmt.Errorf("start providers: %w", err)
		}
		e.logf("%s ready after %s", p.Name, since(begin))
	}
	if err := e.startWorkloadClusters(ctx, binDir, client); err != nil {
		return err
	}
	e.logf("%s ready after %s", workloadClustersName, since(begin))
	return nil
}

// startWorkloadClusters runs the stand-in for the machines and the
// workload clusters' API servers: it serves every Cluster whose
// control-plane endpoint is on 127.0.0.1 (docs/providers.md). It listens
// as soon as the cluster's CA exists (--early-listener), so Cluster API's
// first connection to the new cluster succeeds instead of waiting out its
// 30 s retry.
func (e *Env) startWorkloadClusters(ctx context.Context, binDir string, client *http.Client) error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + e.KubeconfigPath,
		"--health-addr=127.0.0.1:" + strconv.Itoa(ports[0]),
		"--early-listener",
	}
	proc, err := startProcess(ctx, e.Dir, workloadClustersName, filepath.Join(binDir, workloadClustersName), args)
	if err != nil {
		return err
	}
	e.providers = append(e.providers, proc)
	return proc.waitUntil(ctx, httpOK(client, "http://127.0.0.1:"+strconv.Itoa(ports[0])+"/readyz", ""))
}

// writeWebhookCerts gives the providers' webhook servers the env's serving
// certificate (for 127.0.0.1) under the file names controller-runtime
// looks for.
func (e *Env) writeWebhookCerts(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("write webhook certificates: %w", err)
	}
	for src, dst := range map[string]string{e.pki.servingCert: "tls.crt", e.pki.servingKey: "tls.key"} {
		data, err := os.ReadFile(src)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, dst), data, 0o600)
		}
		if err != nil {
			return fmt.Errorf("write webhook certificates: %w", err)
		}
	}
	return nil
}

// applyWebhooks server-side applies the webhook configurations.
func (e *Env) applyWebhooks(ctx context.Context, hooks []webhookConfiguration) error {
	force := true
	opts := metav1.PatchOptions{FieldManager: webhookFieldManager, Force: &force}
	for _, h := range hooks {
		var err error
		switch h.kind {
		case "MutatingWebhookConfiguration":
			_, err = e.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(ctx, h.name, types.ApplyPatchType, h.json, opts)
		default:
			_, err = e.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Patch(ctx, h.name, types.ApplyPatchType, h.json, opts)
		}
		if err != nil {
			return fmt.Errorf("apply %s/%s: %w", h.kind, h.name, err)
		}
	}
	return nil
}

// tlsServes is ready once a TLS handshake with 127.0.0.1:port succeeds
// with a certificate the env's CA signed: the webhook server is up.
func tlsServes(client *http.Client, port int) func(context.Context) (bool, error) {
	cfg := client.Transport.(*http.Transport).TLSClientConfig
	return func(ctx context.Context) (bool, error) {
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 2 * time.Second}, Config: cfg}
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return false, fmt.Errorf("webhook server on port %d: %w", port, err)
		}
		conn.Close()
		return true, nil
	}
}

// allOf is ready when every check is, in order.
func allOf(checks ...func(context.Context) (bool, error)) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		for _, c := range checks {
			if ok, err := c(ctx); !ok || err != nil {
				return ok, err
			}
		}
		return true, nil
	}
}

// stopProviders stops the providers in the reverse order of their start.
func (e *Env) stopProviders() error {
	var errs []error
	for i := len(e.providers) - 1; i >= 0; i-- {
		errs = append(errs, e.providers[i].stop())
	}
	e.providers = nil
	return errors.Join(errs...)
}

// managerCommand runs a manager built on Cluster API's flags (Cluster
// API's three, CAPM3 and IPAM): no leader election, probes and plain-HTTP
// metrics on loopback, webhooks on their own port. --kubeconfig is always
// given: without it a manager in a pod would prefer the in-cluster config.
func managerCommand(e *Env, p providerPorts, certDir string) (args, env []string) {
	return []string{
		"--kubeconfig=" + e.KubeconfigPath,
		"--leader-elect=false",
		"--health-addr=127.0.0.1:" + strconv.Itoa(p.health),
		"--diagnostics-address=127.0.0.1:" + strconv.Itoa(p.metrics),
		"--insecure-diagnostics",
		"--webhook-port=" + strconv.Itoa(p.webhook),
		"--webhook-cert-dir=" + certDir,
	}, nil
}

// bmoCommand runs the BareMetal Operator in demo mode: its demo
// provisioner stands in for Ironic and the hardware, moving every host
// through registering, inspecting and available, and provisioning it when
// it is given an image. Unlike test mode (one fixture shared by all hosts
// of the process) each host moves on its own, and hosts with the names
// the demo provisioner knows fail or hang on purpose (docs/providers.md).
// BMO reads its webhook certificate from
// $TMPDIR/k8s-webhook-server/serving-certs and serves metrics only with
// authentication, so they are off.
func bmoCommand(e *Env, p providerPorts, certDir string) (args, env []string) {
	return []string{
		"-kubeconfig=" + e.KubeconfigPath,
		"-demo-mode",
		"-health-addr=127.0.0.1:" + strconv.Itoa(p.health),
		"-metrics-addr=0",
		"-webhook-port=" + strconv.Itoa(p.webhook),
		"-dev",
	}, []string{"TMPDIR=" + webhookTmpDir(certDir)}
}

// webhookCertDir is where the providers find their webhook certificate:
// the folder controller-runtime's default layout puts under TMPDIR, so
// that the BareMetal Operator, which has no flag for it, finds it too.
func webhookCertDir(envDir string) string {
	return filepath.Join(envDir, "webhook-tmp", "k8s-webhook-server", "serving-certs")
}

// webhookTmpDir is the TMPDIR whose default layout holds certDir.
func webhookTmpDir(certDir string) string {
	return filepath.Dir(filepath.Dir(certDir))
}

package stages

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/capstan-dev/capstan/failure"
)

// A kubeconfig read from a Secret is written by whoever may write that
// Secret: a tenant, or a controller acting on a tenant's objects. Capstan
// builds its connection from the fields that only say where to connect
// and with which inline credential, and refuses every field that would
// make Capstan's own process run a command (exec, auth-provider), read a
// file of its pod (tokenFile, certificate-authority, client-certificate,
// client-key: Capstan's own ServiceAccount token is such a file) or turn
// certificate verification off (insecure-skip-tls-verify). docs/kubeconfigs.md
// lists each field and why.

// ReasonKubeconfigRefused: a kubeconfig Secret holds a field Capstan does
// not use from a Secret, or reaches a cluster the deployment may not use
// through it. Only a change of the Secret (or of capstan run's flags)
// heals it.
const ReasonKubeconfigRefused = "KubeconfigRefused"

// KubeconfigPolicy says what a kubeconfig from a Secret may hold beyond
// what only connects. The zero policy is the safe one.
type KubeconfigPolicy struct {
	// AllowExec lets the kubeconfig's user run a credential plugin (exec)
	// or use an auth-provider: `capstan run --insecure-kubeconfig-exec`.
	// The command runs in Capstan's pod, with its environment and files.
	AllowExec bool
	// AllowInsecureTLS lets the kubeconfig's cluster skip the
	// verification of the server's certificate (insecure-skip-tls-verify):
	// `capstan run --insecure-kubeconfig-tls`.
	AllowInsecureTLS bool
}

// KubeconfigOption configures NewKubeconfigCluster.
type KubeconfigOption func(*kubeconfigSettings)

type kubeconfigSettings struct {
	policy KubeconfigPolicy
}

// WithKubeconfigPolicy lets the kubeconfig hold what policy allows beyond
// the safe default (none of exec, auth-provider, insecure-skip-tls-verify).
func WithKubeconfigPolicy(policy KubeconfigPolicy) KubeconfigOption {
	return func(s *kubeconfigSettings) { s.policy = policy }
}

// Network deadlines of a connection to another cluster. There is no
// deadline on a whole request: a watch lasts as long as it lasts.
const (
	// remoteDialTimeout bounds opening a TCP connection.
	remoteDialTimeout = 10 * time.Second
	// remoteTLSHandshakeTimeout bounds the TLS handshake (client-go's
	// transport sets the same value; checked by a test).
	remoteTLSHandshakeTimeout = 10 * time.Second
)

// remoteResponseHeaderTimeout bounds the wait for a response's headers
// once a request is sent: a server that accepts and never answers costs
// this, not a worker forever. A variable for tests.
var remoteResponseHeaderTimeout = 30 * time.Second

// KubeconfigRefusedError names a field of a kubeconfig that Capstan does
// not use from a Secret, and the entry (user, cluster) that holds it.
// Its message never quotes the field's value.
type KubeconfigRefusedError struct {
	// Entry names the kubeconfig entry: `user "admin"`, `cluster "prod"`.
	Entry string
	// Field is the kubeconfig field, as written in YAML: "exec", "tokenFile".
	Field string
	// Why says what the field would make Capstan do.
	Why string
	// Flag is the capstan run flag that allows the field, if one does.
	Flag string
}

func (e *KubeconfigRefusedError) Error() string {
	msg := fmt.Sprintf("%s: field %s is refused: %s", e.Entry, e.Field, e.Why)
	if e.Flag != "" {
		msg += fmt.Sprintf("; the platform may allow it for every kubeconfig Secret with capstan run %s", e.Flag)
	}
	return msg
}

// Failure makes the refusal stalled: the Secret must change.
func (e *KubeconfigRefusedError) Failure() *failure.Error {
	return &failure.Error{Reason: ReasonKubeconfigRefused, Policy: failure.PolicyStalled, Err: e}
}

// IsKubeconfigRefused reports whether err refuses a kubeconfig's field.
func IsKubeconfigRefused(err error) bool {
	var r *KubeconfigRefusedError
	return errors.As(err, &r)
}

// inlineOnly ends the message of a refused file or command: what a
// kubeconfig Secret may hold instead.
const inlineOnly = "a kubeconfig Secret may hold its credentials inline only (certificate-authority-data, client-certificate-data, client-key-data, token, username/password)"

// CheckKubeconfig returns the fields of the current context's cluster and
// user that policy refuses, one error each (KubeconfigRefusedError), or
// nil. The entries the current context does not use are never read and
// not checked. cfg comes from clientcmd.Load, which reads no file and
// sets no LocationOfOrigin.
func CheckKubeconfig(cfg *clientcmdapi.Config, policy KubeconfigPolicy) error {
	kctx := cfg.Contexts[cfg.CurrentContext]
	if kctx == nil {
		return nil
	}
	var errs []error
	refuse := func(entry, field, why, flag string) {
		errs = append(errs, &KubeconfigRefusedError{Entry: entry, Field: field, Why: why, Flag: flag})
	}
	if c := cfg.Clusters[kctx.Cluster]; c != nil {
		entry := "cluster " + entryName(kctx.Cluster)
		if c.CertificateAuthority != "" {
			refuse(entry, "certificate-authority", "it names a file in Capstan's pod; use certificate-authority-data; "+inlineOnly, "")
		}
		if c.InsecureSkipTLSVerify && !policy.AllowInsecureTLS {
			refuse(entry, "insecure-skip-tls-verify", "it turns off the verification of the server's certificate, so anyone on the path can take the credentials; give certificate-authority-data", "--insecure-kubeconfig-tls")
		}
	}
	if u := cfg.AuthInfos[kctx.AuthInfo]; u != nil {
		entry := "user " + entryName(kctx.AuthInfo)
		if u.TokenFile != "" {
			refuse(entry, "tokenFile", "it names a file in Capstan's pod (such as Capstan's own ServiceAccount token); use token; "+inlineOnly, "")
		}
		if u.ClientCertificate != "" {
			refuse(entry, "client-certificate", "it names a file in Capstan's pod; use client-certificate-data; "+inlineOnly, "")
		}
		if u.ClientKey != "" {
			refuse(entry, "client-key", "it names a file in Capstan's pod; use client-key-data; "+inlineOnly, "")
		}
		if u.Exec != nil && !policy.AllowExec {
			refuse(entry, "exec", "it runs a command inside Capstan's pod, with Capstan's environment and files; "+inlineOnly, "--insecure-kubeconfig-exec")
		}
		if u.AuthProvider != nil && !policy.AllowExec {
			refuse(entry, "auth-provider", "an auth-provider plugin runs inside Capstan's pod and fetches tokens from where the kubeconfig says; "+inlineOnly, "--insecure-kubeconfig-exec")
		}
	}
	return errors.Join(errs...)
}

// entryName quotes a kubeconfig entry's name for a message, shortened:
// the name is the Secret writer's, and a message is no place for a page.
func entryName(name string) string {
	if len(name) > 63 {
		name = name[:60] + "..."
	}
	return fmt.Sprintf("%q", name)
}

// restConfigFrom reads a kubeconfig and builds the connection from the
// fields of its current context that policy allows, and from nothing
// else: no file, no environment variable, no default location is read
// (clientcmd's loaders would). Its errors describe the problem without
// quoting the content: a YAML error may quote a token.
func restConfigFrom(kubeconfig []byte, policy KubeconfigPolicy) (*rest.Config, error) {
	if len(kubeconfig) == 0 {
		return nil, errors.New("it is empty")
	}
	raw, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return nil, errors.New("it does not parse as a kubeconfig (YAML or JSON)")
	}
	current := raw.CurrentContext
	if current == "" {
		return nil, errors.New("it sets no current-context")
	}
	kctx, ok := raw.Contexts[current]
	if !ok || kctx == nil {
		return nil, fmt.Errorf("its current-context %s is not among its contexts", entryName(current))
	}
	cluster, ok := raw.Clusters[kctx.Cluster]
	if !ok || cluster == nil {
		return nil, fmt.Errorf("context %s names cluster %s, which it does not define", entryName(current), entryName(kctx.Cluster))
	}
	if cluster.Server == "" {
		return nil, fmt.Errorf("cluster %s has no server", entryName(kctx.Cluster))
	}
	user := raw.AuthInfos[kctx.AuthInfo]
	if kctx.AuthInfo != "" && user == nil {
		return nil, fmt.Errorf("context %s names user %s, which it does not define", entryName(current), entryName(kctx.AuthInfo))
	}
	if err := CheckKubeconfig(raw, policy); err != nil {
		return nil, err
	}
	cfg := &rest.Config{
		Host: cluster.Server,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:     cluster.CertificateAuthorityData,
			ServerName: cluster.TLSServerName,
			Insecure:   cluster.InsecureSkipTLSVerify, // allowed by policy, else refused above
		},
		DisableCompression: cluster.DisableCompression,
		// Rate limiting is left to the server's priority and fairness, as
		// for the local cluster.
		QPS: -1, Burst: -1,
	}
	if cluster.ProxyURL != "" {
		proxy, err := proxyFunc(cluster.ProxyURL)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: field proxy-url: %w", entryName(kctx.Cluster), err)
		}
		cfg.Proxy = proxy
	}
	if user != nil {
		cfg.CertData, cfg.KeyData = user.ClientCertificateData, user.ClientKeyData
		cfg.BearerToken = user.Token
		cfg.Username, cfg.Password = user.Username, user.Password
		cfg.Impersonate = rest.ImpersonationConfig{
			UserName: user.Impersonate, UID: user.ImpersonateUID,
			Groups: user.ImpersonateGroups, Extra: user.ImpersonateUserExtra,
		}
		if user.Exec != nil { // allowed by policy, else refused above
			exec := *user.Exec
			// A daemon has no terminal to prompt on.
			exec.StdinUnavailable = true
			exec.StdinUnavailableMessage = "Capstan runs the plugins of kubeconfig Secrets without a terminal"
			if exec.ProvideClusterInfo {
				exec.Config = cluster.Extensions["client.authentication.k8s.io/exec"]
			}
			cfg.ExecProvider = &exec
		}
		if user.AuthProvider != nil { // allowed by policy, else refused above
			ap := *user.AuthProvider
			cfg.AuthProvider = &ap
		}
	}
	if len(cfg.CertData) > 0 != (len(cfg.KeyData) > 0) {
		return nil, fmt.Errorf("user %s: client-certificate-data and client-key-data go together; it has one without the other", entryName(kctx.AuthInfo))
	}
	withDeadlines(cfg)
	return cfg, nil
}

// proxyFunc is the proxy of a kubeconfig's proxy-url: http, https or
// socks5, as client-go allows. It sends the kubeconfig's own requests
// through the proxy, which reaches nothing the server field could not.
func proxyFunc(raw string) (func(*http.Request) (*url.URL, error), error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("it does not parse as a URL")
	}
	switch u.Scheme {
	case "http", "https", "socks5":
	default:
		return nil, fmt.Errorf("scheme %q: want http, https or socks5", u.Scheme)
	}
	if u.Host == "" {
		return nil, errors.New("it names no host")
	}
	return http.ProxyURL(u), nil
}

// withDeadlines gives cfg the network deadlines of a remote connection:
// dialling and the TLS handshake (client-go's transport) take at most
// 10 s each, and a response's headers come within 30 s of the request.
func withDeadlines(cfg *rest.Config) {
	dialer := &net.Dialer{Timeout: remoteDialTimeout, KeepAlive: 30 * time.Second}
	cfg.Dial = dialer.DialContext
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &headerDeadline{next: rt, timeout: remoteResponseHeaderTimeout}
	})
}

// noHeadersError is a request cancelled for want of response headers.
// It is a network timeout (net.Error): the path to the cluster failed,
// not the request, and the stage waits for the cluster.
type noHeadersError struct {
	method, path string
	timeout      time.Duration
}

var _ net.Error = (*noHeadersError)(nil)

func (e *noHeadersError) Error() string {
	return fmt.Sprintf("%s %s: no response headers within %s", e.method, e.path, e.timeout)
}
func (e *noHeadersError) Timeout() bool   { return true }
func (e *noHeadersError) Temporary() bool { return true }

// headerDeadline cancels a request whose response headers do not come
// within timeout; once they come, the body (a watch) may take as long as
// the caller's context allows.
type headerDeadline struct {
	next    http.RoundTripper
	timeout time.Duration
}

func (h *headerDeadline) RoundTrip(req *http.Request) (*http.Response, error) {
	late := &noHeadersError{method: req.Method, path: req.URL.Path, timeout: h.timeout}
	ctx, cancel := context.WithCancelCause(req.Context())
	timer := time.AfterFunc(h.timeout, func() { cancel(late) })
	resp, err := h.next.RoundTrip(req.WithContext(ctx))
	if !timer.Stop() {
		// The deadline passed: whatever came back is cancelled.
		cancel(late)
		if resp != nil && resp.Body != nil {
			_ = resp.Body.Close()
		}
		return nil, late
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: func() { cancel(nil) }}
	return resp, nil
}

// WrappedRoundTripper lets client-go's utilities look through the wrapper.
func (h *headerDeadline) WrappedRoundTripper() http.RoundTripper { return h.next }

// cancelOnClose ends a response's context with its body.
type cancelOnClose struct {
	io.ReadCloser
	cancel func()
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

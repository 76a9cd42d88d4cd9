package stages_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/capstan-dev/capstan/internal/testca"
	"github.com/capstan-dev/capstan/stages"
)

// A value no message may quote: the exec command, file paths and tokens
// of the kubeconfigs below all hold it.
const kubeconfigMarker = "m4rker-never-quoted"

// kubeconfigWith is a kubeconfig of inline credentials (cluster c, user
// u, context x), changed by change.
func kubeconfigWith(t testing.TB, change func(*clientcmdapi.Config)) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:6443", CertificateAuthorityData: []byte("ca-" + kubeconfigMarker)}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: "token-" + kubeconfigMarker}
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "x"
	if change != nil {
		change(cfg)
	}
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

var markerExec = &clientcmdapi.ExecConfig{Command: "/bin/sh", Args: []string{"-c", "touch /tmp/" + kubeconfigMarker},
	APIVersion: "client.authentication.k8s.io/v1", InteractiveMode: clientcmdapi.NeverExecInteractiveMode}

// TestRestConfigFromRefusesWhatDoesNotOnlyConnect pins each field a
// kubeconfig Secret may not hold (named with its entry, stalled, never
// quoted), what it may, and what the opt-ins of capstan run allow.
func TestRestConfigFromRefusesWhatDoesNotOnlyConnect(t *testing.T) {
	user := func(f func(*clientcmdapi.AuthInfo)) func(*clientcmdapi.Config) {
		return func(c *clientcmdapi.Config) { f(c.AuthInfos["u"]) }
	}
	cluster := func(f func(*clientcmdapi.Cluster)) func(*clientcmdapi.Config) {
		return func(c *clientcmdapi.Config) { f(c.Clusters["c"]) }
	}
	allowExec := stages.KubeconfigPolicy{AllowExec: true}
	allowTLS := stages.KubeconfigPolicy{AllowInsecureTLS: true}
	for _, tc := range []struct {
		name   string
		change func(*clientcmdapi.Config)
		policy stages.KubeconfigPolicy
		// refused lists what the error must say, each an entry and its
		// field; empty: accepted, and check looks at the result.
		refused []string
		check   func(*rest.Config) error
	}{
		{"inline CA and token connect", nil, stages.KubeconfigPolicy{}, nil, func(c *rest.Config) error {
			if c.Host != "https://127.0.0.1:6443" || c.BearerToken != "token-"+kubeconfigMarker || string(c.CAData) != "ca-"+kubeconfigMarker {
				return fmt.Errorf("host %q, token set %t, CA %q", c.Host, c.BearerToken != "", c.CAData)
			}
			return nil
		}},
		{"inline client certificate and key connect", user(func(u *clientcmdapi.AuthInfo) {
			u.Token, u.ClientCertificateData, u.ClientKeyData = "", []byte("cert"), []byte("key")
		}), stages.KubeconfigPolicy{}, nil, func(c *rest.Config) error {
			if string(c.CertData) != "cert" || string(c.KeyData) != "key" {
				return errors.New("the inline certificate and key were dropped")
			}
			return nil
		}},
		{"basic auth inline connects", user(func(u *clientcmdapi.AuthInfo) { u.Token, u.Username, u.Password = "", "admin", "pw" }),
			stages.KubeconfigPolicy{}, nil, func(c *rest.Config) error {
				if c.Username != "admin" || c.Password != "pw" {
					return errors.New("basic auth dropped")
				}
				return nil
			}},
		{"act-as is the credential's own business", user(func(u *clientcmdapi.AuthInfo) { u.Impersonate = "jane" }),
			stages.KubeconfigPolicy{}, nil, func(c *rest.Config) error {
				if c.Impersonate.UserName != "jane" {
					return errors.New("act-as dropped")
				}
				return nil
			}},
		{"tls-server-name, disable-compression and a proxy connect", cluster(func(c *clientcmdapi.Cluster) {
			c.TLSServerName, c.DisableCompression, c.ProxyURL = "api.internal", true, "socks5://127.0.0.1:1080"
		}), stages.KubeconfigPolicy{}, nil, func(c *rest.Config) error {
			if c.ServerName != "api.internal" || !c.DisableCompression || c.Proxy == nil {
				return errors.New("server name, compression or proxy dropped")
			}
			return nil
		}},
		{"extensions and preferences are inert", func(c *clientcmdapi.Config) {
			c.Preferences.Colors = true
			c.Extensions["x"] = &runtime.Unknown{Raw: []byte(`{"exec":"` + kubeconfigMarker + `"}`)}
			c.Clusters["c"].Extensions = map[string]runtime.Object{"client.authentication.k8s.io/exec": &runtime.Unknown{Raw: []byte(`{}`)}}
		}, stages.KubeconfigPolicy{}, nil, func(c *rest.Config) error {
			if c.ExecProvider != nil {
				return errors.New("an extension made an exec provider")
			}
			return nil
		}},
		{"an exec user the current context does not use is never read", func(c *clientcmdapi.Config) {
			c.AuthInfos["other"] = &clientcmdapi.AuthInfo{Exec: markerExec, TokenFile: "/var/run/" + kubeconfigMarker}
			c.Contexts["other"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "other"}
		}, stages.KubeconfigPolicy{}, nil, func(c *rest.Config) error {
			if c.ExecProvider != nil || c.BearerTokenFile != "" {
				return errors.New("the unused user's exec or token file was taken")
			}
			return nil
		}},
		{"exec", user(func(u *clientcmdapi.AuthInfo) { u.Exec = markerExec }), stages.KubeconfigPolicy{},
			[]string{`user "u": field exec is refused`, "runs a command", "--insecure-kubeconfig-exec"}, nil},
		{"exec with --insecure-kubeconfig-exec", user(func(u *clientcmdapi.AuthInfo) { u.Exec = markerExec }), allowExec, nil,
			func(c *rest.Config) error {
				if c.ExecProvider == nil || c.ExecProvider.Command != "/bin/sh" || !c.ExecProvider.StdinUnavailable {
					return fmt.Errorf("exec provider %v, want the plugin without stdin", c.ExecProvider)
				}
				return nil
			}},
		{"auth-provider", user(func(u *clientcmdapi.AuthInfo) {
			u.AuthProvider = &clientcmdapi.AuthProviderConfig{Name: "oidc", Config: map[string]string{"idp-issuer-url": kubeconfigMarker}}
		}), stages.KubeconfigPolicy{}, []string{`user "u": field auth-provider is refused`, "--insecure-kubeconfig-exec"}, nil},
		{"auth-provider with --insecure-kubeconfig-exec", user(func(u *clientcmdapi.AuthInfo) {
			u.AuthProvider = &clientcmdapi.AuthProviderConfig{Name: "oidc"}
		}), allowExec, nil, func(c *rest.Config) error {
			if c.AuthProvider == nil || c.AuthProvider.Name != "oidc" {
				return errors.New("auth-provider dropped")
			}
			return nil
		}},
		{"tokenFile, even with every opt-in", user(func(u *clientcmdapi.AuthInfo) { u.TokenFile = "/var/run/secrets/" + kubeconfigMarker }),
			stages.KubeconfigPolicy{AllowExec: true, AllowInsecureTLS: true}, []string{`user "u": field tokenFile is refused`, "Capstan's own ServiceAccount token"}, nil},
		{"client-certificate", user(func(u *clientcmdapi.AuthInfo) { u.ClientCertificate = "/etc/" + kubeconfigMarker }),
			stages.KubeconfigPolicy{}, []string{`user "u": field client-certificate is refused`, "use client-certificate-data"}, nil},
		{"client-key", user(func(u *clientcmdapi.AuthInfo) { u.ClientKey = "/etc/" + kubeconfigMarker }),
			stages.KubeconfigPolicy{}, []string{`user "u": field client-key is refused`, "use client-key-data"}, nil},
		{"certificate-authority", cluster(func(c *clientcmdapi.Cluster) { c.CertificateAuthority = "/etc/" + kubeconfigMarker }),
			stages.KubeconfigPolicy{}, []string{`cluster "c": field certificate-authority is refused`, "use certificate-authority-data"}, nil},
		{"insecure-skip-tls-verify", cluster(func(c *clientcmdapi.Cluster) { c.InsecureSkipTLSVerify, c.CertificateAuthorityData = true, nil }),
			stages.KubeconfigPolicy{}, []string{`cluster "c": field insecure-skip-tls-verify is refused`, "--insecure-kubeconfig-tls"}, nil},
		{"insecure-skip-tls-verify with --insecure-kubeconfig-tls", cluster(func(c *clientcmdapi.Cluster) { c.InsecureSkipTLSVerify, c.CertificateAuthorityData = true, nil }),
			allowTLS, nil, func(c *rest.Config) error {
				if !c.Insecure {
					return errors.New("insecure dropped")
				}
				return nil
			}},
		{"every refusal at once", func(c *clientcmdapi.Config) {
			c.AuthInfos["u"].Exec, c.AuthInfos["u"].TokenFile = markerExec, "/"+kubeconfigMarker
			c.Clusters["c"].CertificateAuthority = "/" + kubeconfigMarker
		}, stages.KubeconfigPolicy{}, []string{"field exec", "field tokenFile", "field certificate-authority"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := stages.RestConfigFrom(kubeconfigWith(t, tc.change), tc.policy)
			if len(tc.refused) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if err := tc.check(cfg); err != nil {
					t.Error(err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, want := range tc.refused {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if !stages.IsKubeconfigRefused(err) || !stages.IsStalled(err) {
				t.Errorf("error %v is not a stalled refusal", err)
			}
			if strings.Contains(err.Error(), kubeconfigMarker) {
				t.Errorf("error %q quotes the kubeconfig", err)
			}
		})
	}
}

// TestRestConfigFromReadsNoEnvironment: what $KUBECONFIG, ~/.kube/config
// or the in-cluster files hold never joins a kubeconfig from a Secret.
func TestRestConfigFromReadsNoEnvironment(t *testing.T) {
	dir := t.TempDir()
	home := filepath.Join(dir, ".kube", "config")
	if err := os.MkdirAll(filepath.Dir(home), 0o700); err != nil {
		t.Fatal(err)
	}
	// The same names, with an exec plugin, a token file and another server.
	local := kubeconfigWith(t, func(c *clientcmdapi.Config) {
		c.Clusters["c"].Server = "https://10.0.0.1"
		c.AuthInfos["u"] = &clientcmdapi.AuthInfo{Exec: markerExec, TokenFile: "/var/run/token"}
	})
	if err := os.WriteFile(home, local, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HOME", dir)
	t.Setenv("KUBECONFIG", home)
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	cfg, err := stages.RestConfigFrom(kubeconfigWith(t, nil), stages.KubeconfigPolicy{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://127.0.0.1:6443" || cfg.ExecProvider != nil || cfg.BearerTokenFile != "" {
		t.Errorf("the environment's kubeconfig leaked in: host %q, exec %v, token file %q", cfg.Host, cfg.ExecProvider, cfg.BearerTokenFile)
	}
}

// TestRemoteConnectionsHaveNetworkDeadlines: dialling and the TLS
// handshake are bounded by the transport, and a server that never sends
// response headers fails the request, while a watch whose headers came
// stays open past that deadline.
func TestRemoteConnectionsHaveNetworkDeadlines(t *testing.T) {
	ca := testca.Must(t, "remote")
	cfg, err := stages.RestConfigFrom(kubeconfigWith(t, func(c *clientcmdapi.Config) {
		c.Clusters["c"].CertificateAuthorityData = ca.PEM
	}), stages.KubeconfigPolicy{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Dial == nil {
		t.Error("no dialer of its own: client-go's dials for 30 s")
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for {
		if tr, ok := rt.(*http.Transport); ok {
			if tr.TLSHandshakeTimeout != stages.RemoteTLSHandshakeTimeout {
				t.Errorf("TLS handshake timeout %s, want %s", tr.TLSHandshakeTimeout, stages.RemoteTLSHandshakeTimeout)
			}
			break
		}
		w, ok := rt.(interface{ WrappedRoundTripper() http.RoundTripper })
		if !ok {
			t.Fatalf("cannot see through %T to the transport", rt)
		}
		rt = w.WrappedRoundTripper()
	}

	defer stages.SetResponseHeaderTimeout(200 * time.Millisecond)()
	stop, event := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") == "true" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select { // sent after the header deadline
			case <-event:
			case <-stop:
				return
			}
			fmt.Fprintln(w, `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"late","namespace":"ns","resourceVersion":"2"}}}`)
			w.(http.Flusher).Flush()
			<-stop
			return
		}
		select { // never answers
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	defer srv.Close()
	defer close(stop)
	remote, err := stages.NewKubeconfigCluster("Secret ns/silent", kubeconfigWith(t, func(c *clientcmdapi.Config) {
		c.Clusters["c"].Server, c.Clusters["c"].CertificateAuthorityData = srv.URL, nil
	}), scheme.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = remote.CheckAvailable(ctx)
	if err == nil || !strings.Contains(err.Error(), "no response headers within") {
		t.Errorf("CheckAvailable on a server that never answers = %v, want the header deadline", err)
	}
	if !stages.IsNetworkError(err) {
		t.Errorf("the header deadline (%v) is not a network error: the stage would fail instead of waiting", err)
	}

	disco := remote.(interface {
		Discovery() discovery.DiscoveryInterface
	}).Discovery()
	body, err := disco.RESTClient().Get().AbsPath("/api/v1/namespaces/ns/configmaps").Param("watch", "true").Stream(ctx)
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer body.Close()
	// Past the header deadline, the watch's first event comes.
	time.AfterFunc(600*time.Millisecond, func() { close(event) })
	line, err := bufio.NewReader(body).ReadString('\n')
	if err != nil || !strings.Contains(line, `"late"`) {
		t.Fatalf("the watch ended before its first event (%q, %v): the header deadline cut it", line, err)
	}
}

// FuzzKubeconfig: whatever a Secret holds, a kubeconfig accepted under
// the default policy builds a connection that runs nothing, reads no
// file and verifies TLS. Corpus: testdata/fuzz/FuzzKubeconfig.
func FuzzKubeconfig(f *testing.F) {
	f.Add(kubeconfigWith(f, nil))
	f.Add(kubeconfigWith(f, func(c *clientcmdapi.Config) { c.AuthInfos["u"].Exec = markerExec }))
	f.Add(kubeconfigWith(f, func(c *clientcmdapi.Config) { c.AuthInfos["u"].TokenFile = "/var/run/token" }))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := stages.RestConfigFrom(data, stages.KubeconfigPolicy{})
		if err != nil {
			return
		}
		if cfg.ExecProvider != nil || cfg.AuthProvider != nil || cfg.BearerTokenFile != "" ||
			cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "" || cfg.Insecure {
			t.Fatalf("accepted a kubeconfig that runs a command, reads a file or skips TLS verification: %+v", cfg)
		}
	})
}

// TestClusterUIDIsAskedOncePerConnection: a connection reads namespace
// kube-system once, whatever the answer, and a refusal means "cannot
// tell".
func TestClusterUIDIsAskedOncePerConnection(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		want   string
	}{
		{"the credential may read it", http.StatusOK, "the-uid"},
		{"the credential may not", http.StatusForbidden, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			asked := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				switch r.URL.Path {
				case "/api":
					fmt.Fprint(w, `{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[]}`)
				case "/apis":
					fmt.Fprint(w, `{"kind":"APIGroupList","apiVersion":"v1","groups":[]}`)
				case "/api/v1":
					fmt.Fprint(w, `{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"namespaces","singularName":"namespace","namespaced":false,"kind":"Namespace","verbs":["get"]}]}`)
				case "/api/v1/namespaces/kube-system":
					mu.Lock()
					asked++
					mu.Unlock()
					if tc.status != http.StatusOK {
						w.WriteHeader(tc.status)
						fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":%d}`, tc.status)
						return
					}
					fmt.Fprint(w, `{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"kube-system","uid":"the-uid"}}`)
				default:
					http.NotFound(w, r)
				}
			}))
			defer srv.Close()
			remote, err := stages.NewKubeconfigCluster("Secret ns/k", kubeconfigWith(t, func(c *clientcmdapi.Config) {
				c.Clusters["c"].Server, c.Clusters["c"].CertificateAuthorityData = srv.URL, nil
			}), scheme.Scheme)
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				got, err := remote.(stages.ClusterIdentifier).ClusterUID(t.Context())
				if err != nil || got != tc.want {
					t.Fatalf("ClusterUID = %q, %v; want %q", got, err, tc.want)
				}
			}
			if asked != 1 {
				t.Errorf("namespace kube-system read %d times for one connection, want once", asked)
			}
		})
	}
}

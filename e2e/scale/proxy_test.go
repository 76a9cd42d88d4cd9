package scale

import (
	"cmp"
	"encoding/pem"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// apiProxy is a TLS reverse proxy in front of the API server that counts
// every request the daemon sends, by method and path, with the start of a
// watch counted apart: a watch is one long request that client-go renews
// every five to ten minutes on its own, so a renewal that falls into a
// measured window is not a request "per interval". The daemon reaches the
// API server only through it (its kubeconfig names the proxy), over
// TLS and HTTP/2 as it would reach a real one.
type apiProxy struct {
	srv *httptest.Server

	mu       sync.Mutex
	requests map[string]int64 // "GET /api/v1/namespaces/x/configmaps" -> count
	watches  map[string]int64
}

func startAPIProxy(t testing.TB) *apiProxy {
	t.Helper()
	upstream, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	transport, err := rest.TransportFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	p := &apiProxy{requests: map[string]int64{}, watches: map[string]int64{}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(upstream)
			r.Out.Host = upstream.Host
		},
		Transport:     transport,
		FlushInterval: -1, // watch events pass at once
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// A client that went away (a watch stopped) is no error.
			if r.Context().Err() == nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
			}
		},
	}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.count(r)
		rp.ServeHTTP(w, r)
	}))
	p.srv.EnableHTTP2 = true
	p.srv.StartTLS()
	t.Cleanup(p.srv.Close)
	return p
}

func (p *apiProxy) count(r *http.Request) {
	q := r.URL.Query()
	watch := q.Get("watch") == "true" || q.Get("watch") == "1" || strings.Contains(r.URL.Path, "/watch/")
	key := r.Method + " " + r.URL.Path
	if q.Has("dryRun") {
		key = r.Method + "(dry-run) " + r.URL.Path
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if watch {
		p.watches[key]++
	} else {
		p.requests[key]++
	}
}

// counts is a snapshot of what the proxy has counted.
type counts struct {
	requests, watches map[string]int64
}

func (p *apiProxy) snapshot() counts {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := counts{requests: map[string]int64{}, watches: map[string]int64{}}
	for k, v := range p.requests {
		c.requests[k] = v
	}
	for k, v := range p.watches {
		c.watches[k] = v
	}
	return c
}

// since returns what was counted after before: requests, watches started,
// and the requests by "METHOD path".
func (c counts) since(before counts) (requests, watches int64, byPath map[string]int64) {
	byPath = map[string]int64{}
	for k, v := range c.requests {
		if d := v - before.requests[k]; d > 0 {
			requests += d
			byPath[k] = d
		}
	}
	for k, v := range c.watches {
		watches += v - before.watches[k]
	}
	return requests, watches, byPath
}

// kubeconfig writes a kubeconfig that reaches the API server through the
// proxy, as the admin of the test control plane (the proxy authenticates
// upstream).
func (p *apiProxy) kubeconfig(t testing.TB) string {
	t.Helper()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["proxy"] = &clientcmdapi.Cluster{Server: p.srv.URL, CertificateAuthorityData: ca}
	cfg.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy"}
	cfg.CurrentContext = "proxy"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// topPaths formats the n most frequent entries of byPath, for a log line.
func topPaths(byPath map[string]int64, n int) string {
	paths := slices.SortedFunc(maps.Keys(byPath), func(a, b string) int {
		return cmp.Or(cmp.Compare(byPath[b], byPath[a]), strings.Compare(a, b))
	})
	var parts []string
	for _, p := range paths[:min(n, len(paths))] {
		parts = append(parts, fmt.Sprintf("%s x%d", p, byPath[p]))
	}
	return strings.Join(parts, "; ")
}

// requestKind reduces "METHOD /apis/g/v/namespaces/ns/resource/name/sub"
// to "METHOD resource/sub": what a request did, whichever object it was.
// A GET of a collection is a LIST.
func requestKind(key string) string {
	method, path, _ := strings.Cut(key, " ")
	parts := strings.Split(strings.Trim(path, "/"), "/")
	// Past /api/v1 or /apis/group/version.
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return key
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	resource := parts[0]
	if len(parts) == 1 && method == "GET" {
		method = "LIST"
	}
	if len(parts) >= 3 {
		resource += "/" + parts[2]
	}
	return method + " " + resource
}

// byKind sums byPath by requestKind.
func byKind(byPath map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range byPath {
		out[requestKind(k)] += v
	}
	return out
}

// perDeployment formats every entry of by divided by n, most frequent
// first.
func perDeployment(by map[string]int64, n int) string {
	keys := slices.SortedFunc(maps.Keys(by), func(a, b string) int {
		return cmp.Or(cmp.Compare(by[b], by[a]), strings.Compare(a, b))
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, float64(by[k])/float64(n)))
	}
	return strings.Join(parts, "; ")
}

package stages_test

import (
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// TestExecutorWaitsForAClusterItsBalancerAnswersFor: a remote cluster
// whose load balancer answers /version but 503 for every write (the API
// server behind it gone) is waited for, as a cluster that does not
// answer at all is, not failed as if its objects were at fault.
func TestExecutorWaitsForAClusterItsBalancerAnswersFor(t *testing.T) {
	transport, err := rest.TransportFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	upstream, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(upstream)
			r.Out.Header.Del("Authorization") // the balancer's own credentials reach the server
		},
		Transport: transport,
	}
	lb := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			http.Error(w, "no server is available to handle this request", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(lb.Close)
	remote, err := stages.NewKubeconfigCluster("Secret ns/balanced-kubeconfig", kubeconfigFor(t, lb.URL, pemOf(lb.Certificate())...), scheme.Scheme)
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t)
	stage := &stages.Stage{StageSpec: capstanv1.StageSpec{Name: "Remote", Action: capstanv1.StageActionApply},
		Objects: []*unstructured.Unstructured{configMap(ns, "balanced", map[string]any{"a": "b"})}}
	res := stages.NewExecutor(nil).On(remote).ApplyStage(testContext(t), stage, owner)
	if res.State != capstanv1.StageInProgress || !stages.IsUnreachable(res.Err) || stages.IsStalled(res.Err) {
		t.Fatalf("ApplyStage = %s (err %v), want InProgress waiting for the cluster", res.State, res.Err)
	}
}

// pemOf is cert in PEM, as certificate-authority-data holds it.
func pemOf(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

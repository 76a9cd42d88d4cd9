package stages_test

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// path is how a test's client reaches the API server: through a TCP
// proxy that cut() closes, the API server going away; with a load
// balancer (a TLS reverse proxy) in front, which answers for the server
// it lost as load balancers do.
type path struct {
	config *rest.Config
	cut    func()
}

// directPath reaches the API server through a cuttable TCP proxy only.
func directPath(t *testing.T) path {
	proxy := startProxy(t, apiServerHost(t))
	cfg := rest.CopyConfig(env.Config)
	cfg.Host = "https://" + proxy.listener.Addr().String()
	return path{config: cfg, cut: proxy.cut}
}

// balancedPath reaches the API server through a load balancer that
// answers code when the server behind it does not answer.
func balancedPath(code int) func(t *testing.T) path {
	return func(t *testing.T) path {
		backend := directPath(t)
		transport, err := rest.TransportFor(backend.config)
		if err != nil {
			t.Fatal(err)
		}
		upstream, err := url.Parse(backend.config.Host)
		if err != nil {
			t.Fatal(err)
		}
		lb := httptest.NewUnstartedServer(&httputil.ReverseProxy{
			Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(upstream) },
			Transport: transport,
			ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
				http.Error(w, fmt.Sprintf("no server is available to handle this request: %v", err), code)
			},
		})
		lb.EnableHTTP2 = true
		lb.StartTLS()
		t.Cleanup(lb.Close)
		cfg := rest.CopyConfig(env.Config)
		cfg.Host = lb.URL
		cfg.TLSClientConfig = rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: lb.Certificate().Raw})}
		return path{config: cfg, cut: backend.cut}
	}
}

func apiServerHost(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// cutAfter returns a client over p that cuts p once n server-side dry
// runs have been answered: the cluster stops answering in the middle of
// a diff.
func cutAfter(t *testing.T, p path, n int) client.WithWatch {
	t.Helper()
	var (
		mu       sync.Mutex
		answered int
	)
	cfg := rest.CopyConfig(p.config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if req.URL.Query().Has("dryRun") && err == nil {
				mu.Lock()
				answered++
				if answered == n {
					p.cut()
				}
				mu.Unlock()
			}
			return resp, err
		})
	})
	c, err := client.NewWithWatch(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestDiffPlanClusterStopsAnswering: a cluster that stops answering in
// the middle of a diff stops the diff with an UnreachableError; none of
// the objects it could not look at is reported as a problem of the plan,
// whatever the silence looks like on the wire.
func TestDiffPlanClusterStopsAnswering(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	var objects []*unstructured.Unstructured
	for i := range 5 {
		objects = append(objects, configMap(ns, fmt.Sprintf("cm-%d", i), map[string]any{"i": fmt.Sprint(i)}))
	}
	plan, err := stages.BuildPlan([]capstanv1.StageSpec{
		{Name: "Config", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"ConfigMap"}}},
	}, objects)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		path func(*testing.T) path
		// says is what the error says, one of these: a connection cut
		// shows as whichever the client met first.
		says []string
	}{
		{"the API server's connections are cut", directPath, []string{"connection refused", "broken pipe", "connection reset", "EOF"}},
		{"a load balancer answers 502 for the server it lost", balancedPath(http.StatusBadGateway), []string{"no server is available"}},
		{"a load balancer answers 503 for the server it lost", balancedPath(http.StatusServiceUnavailable), []string{"the server is currently unable to handle the request"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One object at a time: two answered, the third finds the
			// cluster gone.
			e := stages.NewExecutor(cutAfter(t, tc.path(t), 2), stages.WithConcurrency(1))
			d, err := e.DiffPlan(ctx, plan, owner, stages.DiffOptions{NewRevision: true})
			if d != nil {
				t.Errorf("DiffPlan returned a diff with %d problems %v, want none: the cluster is not the plan's problem", len(d.Problems()), d.Problems())
			}
			if !stages.IsUnreachable(err) {
				t.Fatalf("DiffPlan error = %v, want an UnreachableError", err)
			}
			for _, want := range []string{"cluster unreachable", "dry-run ConfigMap/" + ns + "/cm-2"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if !slices.ContainsFunc(tc.says, func(s string) bool { return strings.Contains(err.Error(), s) }) {
				t.Errorf("error %q says none of %q", err, tc.says)
			}
		})
	}

	t.Run("the cluster Capstan runs in stops answering the owner lookup", func(t *testing.T) {
		c, _ := newClient(t)
		installDeploymentCRD(t, c)
		west := stages.Owner{Name: "west", Namespace: ns}
		createDeployment(t, c, west)
		if _, err := stages.NewExecutor(c).Apply(ctx, objects[:1], "Config", west); err != nil {
			t.Fatal(err)
		}
		kubeconfig, err := clientcmd.Write(*kubeconfigOf(t))
		if err != nil {
			t.Fatal(err)
		}
		target, err := stages.NewKubeconfigCluster("Secret "+ns+"/target-kubeconfig", kubeconfig, scheme.Scheme)
		if err != nil {
			t.Fatal(err)
		}
		home := directPath(t)
		homeClient, err := client.NewWithWatch(home.config, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		home.cut()
		d, err := stages.NewExecutor(homeClient).On(target).DiffPlan(ctx, plan, stages.Owner{Name: "east", Namespace: ns}, stages.DiffOptions{})
		if d != nil {
			t.Errorf("DiffPlan returned a diff with problems %v, want none", d.Problems())
		}
		if !stages.IsUnreachable(err) || !strings.Contains(err.Error(), "check the owner of ConfigMap/"+ns+"/cm-0") {
			t.Fatalf("DiffPlan error = %v, want an UnreachableError naming the owner lookup", err)
		}
	})
}

// kubeconfigOf is the test control plane's kubeconfig.
func kubeconfigOf(t *testing.T) *clientcmdapi.Config {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(env.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// TestDiffPlanObjectProblemsWhileTheClusterAnswers: what the API server
// says about single objects stays with them, next to the objects it
// takes: a field the schema refuses, and a webhook of the object that
// does not answer (the server answers, InternalError, about this object).
func TestDiffPlanObjectProblemsWhileTheClusterAnswers(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, _ := newClient(t)
	hooked := withLabel(configMap(ns, "hooked", map[string]any{"a": "1"}), "capstan-test/hook", "unanswered")
	installDeadWebhook(t, c, ns, hooked)
	plan, err := stages.BuildPlan([]capstanv1.StageSpec{
		{Name: "Config", Action: capstanv1.StageActionApply, Select: capstanv1.Selector{Kinds: []string{"ConfigMap", "Widget"}}},
	}, []*unstructured.Unstructured{
		configMap(ns, "fine", map[string]any{"a": "1"}),
		widget(ns, "tiny", map[string]any{"size": int64(0)}),
		hooked,
		configMap(ns, "also-fine", map[string]any{"a": "1"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	d, err := stages.NewExecutor(c).DiffPlan(ctx, plan, owner, stages.DiffOptions{NewRevision: true})
	if err != nil {
		t.Fatalf("DiffPlan: %v, want the problems in the diff", err)
	}
	want := map[string]stages.DiffAction{
		"ConfigMap/" + ns + "/fine":      stages.DiffCreate,
		"Widget/" + ns + "/tiny":         stages.DiffInvalid,
		"ConfigMap/" + ns + "/hooked":    stages.DiffFailed,
		"ConfigMap/" + ns + "/also-fine": stages.DiffCreate,
	}
	got := diffActions(d)
	for ref, action := range want {
		if got[ref] != action {
			t.Errorf("%s: %q, want %q", ref, got[ref], action)
		}
	}
	if e := objectDiff(t, d, "ConfigMap/"+ns+"/hooked").Error; !strings.Contains(e, "failed calling webhook") {
		t.Errorf("hooked: error %q, want the webhook named", e)
	}
}

// installDeadWebhook registers, for obj alone, a validating webhook at an
// address nothing listens on, failing closed, and waits until the API
// server calls it.
func installDeadWebhook(t *testing.T, c client.Client, ns string, obj *unstructured.Unstructured) {
	t.Helper()
	ctx := testContext(t)
	hook := &admissionv1.ValidatingWebhookConfiguration{}
	hook.Name = "capstan-test-dead-" + ns
	hook.Webhooks = []admissionv1.ValidatingWebhook{{
		Name:                    "dead.capstan-test.dev",
		ClientConfig:            admissionv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/validate")},
		Rules:                   []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.OperationAll}, Rule: admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}},
		NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
		ObjectSelector:          &metav1.LabelSelector{MatchLabels: obj.GetLabels()},
		FailurePolicy:           ptr.To(admissionv1.Fail),
		SideEffects:             ptr.To(admissionv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
		TimeoutSeconds:          ptr.To[int32](2),
	}}
	if err := c.Create(ctx, hook); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), hook) })
	// The API server picks webhook configurations up from a watch.
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		probe := obj.DeepCopy()
		err := c.Patch(ctx, probe, client.Apply, client.DryRunAll, client.FieldOwner("probe"))
		return err != nil && strings.Contains(err.Error(), "failed calling webhook"), nil
	})
	if err != nil {
		t.Fatal(errors.New("the API server did not call the dead webhook within 30s"))
	}
}

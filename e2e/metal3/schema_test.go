package metal3

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/stages"
)

// A Metal3 cluster as a new user writes it, on the real providers: in a
// namespace of its own that its first stage creates (so no dry run can
// reach its objects before that stage is applied), in the API versions
// the providers' docs use. Both subtests share one daemon, whose writes
// are counted, and run side by side: each walks the real providers to
// ClusterReady, the slow part of this package.
func TestNewUserCluster(t *testing.T) {
	writes := &writeCounter{}
	startDaemon(t, func(o *reconciler.Options) { o.Config = writes.wrap(env.Config) })
	t.Run("unknown field refused before anything is created, then fixed", func(t *testing.T) {
		t.Parallel()
		testUnknownFieldRefused(t, writes)
	})
	t.Run("a cluster written in v1beta1 walks the capm3 profile", func(t *testing.T) {
		t.Parallel()
		testV1beta1Cluster(t)
	})
}

// newUserCluster prepares a deployment of the mgmt example in ns whose
// objects live in target, a namespace that does not exist yet, with edit
// applied to its files; it returns the deployment (not created) and the
// files, committed.
func newUserCluster(t *testing.T, ns, target string, edit func(files map[string]string)) (*capstanv1.ClusterDeployment, map[string]string) {
	t.Helper()
	files := exampleFiles(t, target)
	edit(files)
	cd := exampleDeployment(t, ns, map[string]string{
		"API_ENDPOINT": "127.0.0.1",
		"API_PORT":     strconv.Itoa(freeLoopbackPort(t)),
		// BMO's demo inspection names the NICs nic-1 and nic-2.
		"BOOT_INTERFACE": "nic-1",
	})
	// A fix pushed is seen within a second or two, not the example's
	// minute.
	cd.Spec.Interval = &metav1.Duration{Duration: time.Second}
	cd.Spec.Source = commit(t, ns, files, "a cluster written by a new user")
	dumpStatus(t, target, clusterGVK, kcpGVK, machineGVK)
	return cd, files
}

// replace replaces old with new in files[name] n times exactly, failing
// the test when the example no longer reads as the test expects.
func replace(t *testing.T, files map[string]string, name, old, new string, n int) {
	t.Helper()
	if got := strings.Count(files[name], old); got != n {
		t.Fatalf("%s: %q found %d times, want %d", name, old, got, n)
	}
	files[name] = strings.ReplaceAll(files[name], old, new)
}

// The overlay with one field of CAPM3's v1beta1 left in a v1beta2
// Metal3MachineTemplate (image.format, which v1beta2 calls diskFormat) is
// refused by the preflight before its first stage: not one object is
// written (the Namespace included; the daemon's requests are counted, dry
// runs aside), and the problem names the file, the object and the field.
// With the fix pushed, the same deployment walks to ClusterReady.
func testUnknownFieldRefused(t *testing.T, writes *writeCounter) {
	providerLogs(t)
	c := newClient(t)
	ns := newNamespace(t, "new-user")
	target := ns + "-cluster"
	const controlplane = "bases/metal3-cluster/controlplane.yaml"
	cd, files := newUserCluster(t, ns, target, func(files map[string]string) {
		replace(t, files, controlplane, "diskFormat: qcow2", "format: qcow2", 1)
	})
	if err := c.Create(context.Background(), cd); err != nil {
		t.Fatal(err)
	}

	refused := waitDeployment(t, c, ns, cd.Name, stageTimeout, "Stalled by the preflight", func(cd *capstanv1.ClusterDeployment) bool {
		stalled := condition(cd, capstanv1.ConditionStalled)
		return stalled != nil && stalled.Status == metav1.ConditionTrue && cd.Status.Preflight != nil
	})
	ready := condition(refused, capstanv1.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != stages.PreflightReason {
		t.Errorf("Ready = %+v, want False/%s", ready, stages.PreflightReason)
	}
	if ready != nil {
		t.Logf("refused by the preflight: %s", ready.Message)
	}
	object := "Metal3MachineTemplate " + target + "/mgmt-controlplane"
	field := "spec.template.spec.image.format"
	for _, want := range []string{object, field, "declares no such field", "(in " + controlplane + ")"} {
		if ready != nil && !strings.Contains(ready.Message, want) {
			t.Errorf("Ready message does not say %q:\n%s", want, ready.Message)
		}
	}
	p := refused.Status.Preflight
	found := slices.ContainsFunc(p.Problems, func(p capstanv1.PreflightProblem) bool {
		return p.Severity == "Error" && p.Object == object && p.Field == field
	})
	if p.Errors != 1 || !found {
		t.Errorf("status.preflight = %+v, want one error, of %s at %s", p, object, field)
	}
	for _, st := range refused.Status.Stages {
		if st.State != capstanv1.StagePending {
			t.Errorf("stage %s is %s behind a preflight error, want Pending", st.Name, st.State)
		}
	}
	if n, seen := writes.to(target); n != 0 {
		t.Errorf("%d writes reached namespace %s behind a preflight error: %v", n, target, seen)
	}
	if err := c.Get(context.Background(), client.ObjectKey{Name: target}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
		t.Errorf("Namespace %s: %v, want it not created", target, err)
	}

	replace(t, files, controlplane, "format: qcow2", "diskFormat: qcow2", 1)
	rev, err := gitSrv.Commit(ns, gitserver.DefaultBranch, files, "image.format is diskFormat in v1beta2")
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	done := waitDeployment(t, c, ns, cd.Name, walkTimeout, "Ready at the fixed revision", func(cd *capstanv1.ClusterDeployment) bool {
		return strings.HasSuffix(cd.Status.Revision, rev) && isReady(cd)
	})
	t.Logf("fix pushed -> Ready in %s (%s)", time.Since(begin).Round(time.Millisecond), stageDurations(done))
	if st := stage(done, "ClusterReady"); st.State != capstanv1.StageReady {
		t.Errorf("ClusterReady is %s, want Ready: %s", st.State, describe(done))
	}
	// The counter sees the daemon's writes: the zero above is not one of
	// a counter that sees nothing.
	if n, _ := writes.to(target); n == 0 {
		t.Errorf("no write to namespace %s counted after the fix", target)
	}
}

// The same cluster written in v1beta1 throughout, as most public CAPM3
// examples are (Cluster API's Cluster, KubeadmControlPlane,
// MachineDeployment, KubeadmConfigTemplate and CAPM3's Metal3Cluster,
// Metal3MachineTemplates, Metal3DataTemplate: testdata/v1beta1), reaches
// ClusterReady with the capm3 profile as it is: its checks read the
// objects in v1beta2 through the providers' conversion webhooks, and the
// preflight finds nothing to refuse (v1beta1 being deprecated is a
// warning).
func testV1beta1Cluster(t *testing.T) {
	providerLogs(t)
	c := newClient(t)
	ns := newNamespace(t, "v1beta1")
	target := ns + "-cluster"
	cd, _ := newUserCluster(t, ns, target, func(files map[string]string) {
		for _, name := range []string{"cluster.yaml", "controlplane.yaml", "workers.yaml", "datatemplate.yaml"} {
			content, err := os.ReadFile(filepath.Join("testdata", "v1beta1", name))
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := files["bases/metal3-cluster/"+name]; !ok {
				t.Fatalf("the example's base has no %s", name)
			}
			files["bases/metal3-cluster/"+name] = string(content)
		}
	})
	if cd.Spec.Profile != "capm3" || len(cd.Spec.Stages) != 0 {
		t.Fatalf("the example deployment no longer uses the capm3 profile as it is: profile %q, %d stages", cd.Spec.Profile, len(cd.Spec.Stages))
	}
	begin := time.Now()
	if err := c.Create(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	done := waitDeployment(t, c, ns, cd.Name, walkTimeout, "Ready", isReady)
	t.Logf("v1beta1 cluster created -> Ready in %s (%s)", time.Since(begin).Round(time.Millisecond), stageDurations(done))
	if p := done.Status.Preflight; p != nil && p.Errors != 0 {
		t.Errorf("status.preflight = %+v, want no errors", p)
	}
	for _, st := range done.Status.Stages {
		if st.State != capstanv1.StageReady {
			t.Errorf("stage %s is %s, want Ready", st.Name, st.State)
		}
	}
	// What the controllers read: the v1beta1 field, converted.
	tmpl := &unstructured.Unstructured{}
	tmpl.SetGroupVersionKind(schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "Metal3MachineTemplate"})
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: target, Name: "mgmt-controlplane"}, tmpl); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := unstructured.NestedString(tmpl.Object, "spec", "template", "spec", "image", "diskFormat"); got != "qcow2" {
		t.Errorf("Metal3MachineTemplate %s/mgmt-controlplane read as v1beta2: image.diskFormat = %q, want qcow2", target, got)
	}
}

// writeCounter counts the requests through a rest.Config that may change
// something, dry runs aside, by "METHOD path".
type writeCounter struct {
	mu     sync.Mutex
	writes map[string]int
}

// wrap returns a copy of cfg whose writes are counted.
func (w *writeCounter) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method != http.MethodGet && req.Method != http.MethodHead && !req.URL.Query().Has("dryRun") {
				w.mu.Lock()
				if w.writes == nil {
					w.writes = map[string]int{}
				}
				w.writes[req.Method+" "+req.URL.Path]++
				w.mu.Unlock()
			}
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

// to counts the writes to namespace ns or to objects in it, and lists
// them.
func (w *writeCounter) to(ns string) (int, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	var seen []string
	for key, count := range w.writes {
		if strings.HasSuffix(key, "/namespaces/"+ns) || strings.Contains(key, "/namespaces/"+ns+"/") {
			n += count
			seen = append(seen, key)
		}
	}
	return n, seen
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

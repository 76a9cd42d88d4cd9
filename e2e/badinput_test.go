package e2e

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
)

// badInputs break a deployment that was Ready at a good revision. Each is
// Stalled (retrying cannot help; a new commit can) and must leave one clear
// error in status, keep the good revision's objects as they
// were, and leave the daemon serving the other deployments.
var badInputs = []struct {
	name string
	// change is committed on top of twoStageFiles("1").
	change map[string]string
	// want are substrings of the Ready condition's message.
	want []string
}{
	{
		name: "kustomization lists a file that does not exist",
		change: map[string]string{
			"clusters/two-stage/kustomization.yaml": "resources: [infra.yaml, app.yaml, missing.yaml]\n",
			"clusters/two-stage/app.yaml":           twoStageFiles("2")["clusters/two-stage/app.yaml"],
		},
		want: []string{"clusters/two-stage/kustomization.yaml", "missing.yaml"},
	},
	{
		name: "YAML syntax error",
		change: map[string]string{
			"clusters/two-stage/app.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app-config\ndata: [\n",
		},
		want: []string{"clusters/two-stage/app.yaml"},
	},
	{
		name: "object whose CRD is missing",
		change: map[string]string{
			"clusters/two-stage/kustomization.yaml": "resources: [infra.yaml, app.yaml, gizmo.yaml]\n",
			"clusters/two-stage/gizmo.yaml": `apiVersion: nope.capstan.dev/v1
kind: Gizmo
metadata: {name: g, namespace: "${NS}", labels: {capstan.dev/stage: Infra}}
`,
			"clusters/two-stage/app.yaml": twoStageFiles("2")["clusters/two-stage/app.yaml"],
		},
		want: []string{"preflight", "Gizmo ", "CustomResourceDefinition"},
	},
	{
		name: "invalid field value",
		change: map[string]string{
			"clusters/two-stage/infra.yaml": strings.Replace(twoStageFiles("1")["clusters/two-stage/infra.yaml"], "size: 3", "size: three", 1),
			"clusters/two-stage/app.yaml":   twoStageFiles("2")["clusters/two-stage/app.yaml"],
		},
		want: []string{"preflight", "Widget ", "spec.size"},
	},
}

func TestBadInputKeepsTheLastGoodRevision(t *testing.T) {
	c := newClient(t)
	startDaemon(t, nil)
	for _, tc := range badInputs {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			url, err := gitSrv.CreateRepo(ns)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("1"), "good"); err != nil {
				t.Fatal(err)
			}
			createDeployment(t, c, ns, "two", twoStageSpec(url, ns, gitSecret(t, c, ns)))
			waitFor(t, "Widget infra", func() (bool, error) { return object(t, c, widgetGVK, ns, "infra") != nil, nil })
			setWidgetReady(t, c, ns, "infra")
			good := waitDeployment(t, c, ns, "two", "Ready", isReady)
			if s := good.Status.Summary; s == nil || s.Stage != "2/2" || s.Revision != capstanv1.ShortRevision(good.Status.Revision) {
				t.Errorf("status.summary = %+v at Ready, want stage 2/2 and revision %s", s, capstanv1.ShortRevision(good.Status.Revision))
			}

			bad, err := gitSrv.Commit(ns, gitserver.DefaultBranch, tc.change, tc.name)
			if err != nil {
				t.Fatal(err)
			}
			cd := waitDeployment(t, c, ns, "two", "the bad revision's error", func(cd *capstanv1.ClusterDeployment) bool {
				stalled := condition(cd, capstanv1.ConditionStalled)
				return cd.Status.Revision == "main@sha1:"+bad && stalled != nil && stalled.Status == metav1.ConditionTrue
			})
			msg := condition(cd, capstanv1.ConditionReady).Message
			for _, want := range tc.want {
				if !strings.Contains(msg, want) {
					t.Errorf("Ready message %q does not contain %q", msg, want)
				}
			}
			if ready := condition(cd, capstanv1.ConditionReady); ready.Status != metav1.ConditionFalse {
				t.Errorf("Ready = %s on a stalled deployment", ready.Status)
			}
			// kubectl's STAGE column does not show the good revision's
			// stages as the bad one's.
			if s := cd.Status.Summary; s == nil || s.Stage != "-" || s.Revision != "main@sha1:"+bad[:8] {
				t.Errorf("status.summary = %+v while stalled, want stage - and revision main@sha1:%s", s, bad[:8])
			}
			if v := object(t, c, configMapGVK, ns, "app-config").Object["data"].(map[string]any)["version"]; v != "1" {
				t.Errorf("app-config version = %v, want the good revision's 1: the bad revision was half-applied", v)
			}
			if w := object(t, c, widgetGVK, ns, "infra"); w.Object["spec"].(map[string]any)["size"] != int64(3) {
				t.Errorf("Widget spec = %v, want the good revision's", w.Object["spec"])
			}
		})
	}
}

func TestUnreachableSourceIsRetriedAndOthersAreServed(t *testing.T) {
	c := newClient(t)
	startDaemon(t, nil)
	ns := newNamespace(t)
	createDeployment(t, c, ns, "nowhere", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: "http://127.0.0.1:1/infra.git"}},
		Path:   "clusters/x",
	})
	// A healthy deployment next to it goes all the way.
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("1"), "good"); err != nil {
		t.Fatal(err)
	}
	createDeployment(t, c, ns, "two", twoStageSpec(url, ns, gitSecret(t, c, ns)))
	waitFor(t, "Widget infra", func() (bool, error) { return object(t, c, widgetGVK, ns, "infra") != nil, nil })
	setWidgetReady(t, c, ns, "infra")
	waitDeployment(t, c, ns, "two", "Ready", isReady)

	cd := waitDeployment(t, c, ns, "nowhere", "a source error", func(cd *capstanv1.ClusterDeployment) bool {
		ready := condition(cd, capstanv1.ConditionReady)
		return ready != nil && ready.Status == metav1.ConditionFalse
	})
	msg := condition(cd, capstanv1.ConditionReady).Message
	if !strings.Contains(msg, "http://127.0.0.1:1/infra.git") {
		t.Errorf("Ready message %q does not name the URL", msg)
	}
	if r := condition(cd, capstanv1.ConditionReconciling); r == nil || r.Status != metav1.ConditionTrue {
		t.Errorf("Reconciling = %+v, want True: an unreachable remote is retried", r)
	}
	if s := condition(cd, capstanv1.ConditionStalled); s != nil && s.Status == metav1.ConditionTrue {
		t.Errorf("Stalled = True for an unreachable remote, want it retried")
	}
}

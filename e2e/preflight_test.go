package e2e

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/stages"
)

// preflightFiles hold five mistakes, one of each kind preflight catches,
// in a source that would otherwise apply cleanly.
var preflightFiles = map[string]string{
	"clusters/broken/kustomization.yaml": `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [widgets.yaml, config.yaml]
`,
	"clusters/broken/widgets.yaml": `apiVersion: test.capstan.dev/v1
kind: Widget
metadata:
  name: good
  namespace: ${NS}
  labels: {capstan.dev/stage: Infra}
spec: {size: 3}
---
apiVersion: test.capstan.dev/v1alpha9
kind: Widget
metadata:
  name: unserved
  namespace: ${NS}
  labels: {capstan.dev/stage: Infra}
spec: {size: 3}
---
apiVersion: test.capstan.dev/v1
kind: Widget
metadata:
  name: refused
  namespace: ${NS}
  labels: {capstan.dev/stage: Infra}
spec: {size: three}
`,
	"clusters/broken/config.yaml": `apiVersion: v1
kind: ConfigMap
metadata:
  name: lost
  namespace: ${NS}-missing
  labels: {capstan.dev/stage: App}
data: {a: b}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: region
  namespace: ${NS}
  labels: {capstan.dev/stage: App}
data: {region: "${REGION}"}
`,
}

// A source with an unserved apiVersion, a missing Namespace, a field the
// schema rejects, an empty stage and an unset variable: the deployment
// stalls with all five problems in one status message, and nothing of it
// is created.
func TestPreflightReportsEveryProblemAndCreatesNothing(t *testing.T) {
	c := newClient(t)
	_, counter := startDaemon(t, nil)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := gitSrv.Commit(ns, gitserver.DefaultBranch, preflightFiles, "five mistakes")
	if err != nil {
		t.Fatal(err)
	}
	createDeployment(t, c, ns, "broken", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, Ref: capstanv1.GitRef{Branch: "main"},
			SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(t, c, ns)},
		}},
		Path:       "clusters/broken",
		Substitute: map[string]string{"NS": ns},
		Interval:   &metav1.Duration{Duration: 500 * time.Millisecond},
		Stages: []capstanv1.StageSpec{
			{Name: "Infra"},
			{Name: "App"},
			{Name: "Workers", Select: capstanv1.Selector{Kinds: []string{"cluster.x-k8s.io/MachineDeployment"}}},
		},
	})
	cd := waitDeployment(t, c, ns, "broken", "Stalled by preflight", func(cd *capstanv1.ClusterDeployment) bool {
		stalled := condition(cd, capstanv1.ConditionStalled)
		return cd.Status.Revision == "main@sha1:"+rev && stalled != nil && stalled.Status == metav1.ConditionTrue
	})

	ready := condition(cd, capstanv1.ConditionReady)
	if ready.Status != metav1.ConditionFalse || ready.Reason != stages.PreflightReason {
		t.Errorf("Ready = %s/%s, want False/%s", ready.Status, ready.Reason, stages.PreflightReason)
	}
	for _, want := range []string{
		"preflight found 5 errors",
		"Widget " + ns + "/unserved: apiVersion: Widget is served as test.capstan.dev/v1; not v1alpha9",
		"ConfigMap " + ns + "-missing/lost: metadata.namespace: namespace " + ns + "-missing does not exist",
		"add a Namespace object or set `namespace:` in kustomization.yaml",
		"Widget " + ns + "/refused: spec.size: the API server refuses the object (dry run)",
		"stage Workers: select: selects no object",
		"ConfigMap " + ns + "/region: data.region: ${REGION} is not set and has no default",
		"(in clusters/broken/config.yaml)",
		"(in clusters/broken/widgets.yaml)",
	} {
		if !strings.Contains(ready.Message, want) {
			t.Errorf("Ready message does not contain %q:\n%s", want, ready.Message)
		}
	}
	if p := cd.Status.Preflight; p == nil || p.Errors != 5 || len(p.Problems) != 5 || p.Revision != cd.Status.Revision {
		t.Errorf("status.preflight = %+v, want the 5 errors of %s", p, cd.Status.Revision)
	}

	// Nothing was created: no write reached the cluster but dry runs,
	// the deployment's own status and finalizer, and events.
	for key, n := range counter.snapshot() {
		if strings.Contains(key, "(dry-run)") || strings.Contains(key, "/clusterdeployments/") || strings.Contains(key, "/events") {
			continue
		}
		if strings.Contains(key, "/namespaces/"+ns+"/") || strings.Contains(key, "/namespaces/"+ns+"-missing") {
			t.Errorf("%d× %s: preflight let a write through", n, key)
		}
	}
	if counter.total("(dry-run)", "/namespaces/"+ns+"/") == 0 {
		t.Error("no dry run was sent: the schema check did not run")
	}
	for _, name := range []string{"good", "refused"} {
		if object(t, c, widgetGVK, ns, name) != nil {
			t.Errorf("Widget %s exists", name)
		}
	}
	if object(t, c, configMapGVK, ns, "region") != nil {
		t.Error("ConfigMap region exists")
	}
}

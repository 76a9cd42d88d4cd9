package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/stages"
)

// schemaFiles is an overlay as most cluster overlays are written: its
// first stage creates the namespace the later stages' objects live in,
// so no dry run can reach them before that stage is applied. Each later
// object carries a field its schema does not declare (a built-in kind's,
// read from the cluster's /openapi/v3, and a CRD's); fixed swaps them for
// the right ones.
func schemaFiles(fixed bool) map[string]string {
	data, size := "datas", "sise"
	if fixed {
		data, size = "data", "size"
	}
	return map[string]string{
		"clusters/orion/kustomization.yaml": `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [namespace.yaml, objects.yaml]
`,
		"clusters/orion/namespace.yaml": `apiVersion: v1
kind: Namespace
metadata:
  name: ${TARGET}
  labels: {capstan.dev/stage: Namespace}
`,
		"clusters/orion/objects.yaml": `apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: ${TARGET}
  labels: {capstan.dev/stage: Infra}
` + data + `: {region: north}
---
apiVersion: test.capstan.dev/v1
kind: Widget
metadata:
  name: infra
  namespace: ${TARGET}
  labels: {capstan.dev/stage: Infra}
spec: {` + size + `: 3}
`,
	}
}

// An overlay whose first stage creates its namespace and whose later
// objects carry unknown fields is refused by the preflight before
// anything is applied, not even the Namespace (the schema check stands in
// for the dry run that cannot reach the objects yet); each problem names
// file, object and field. Fixed, it reaches Ready.
func TestSchemaCheckWhereNoDryRunGoes(t *testing.T) {
	c := newClient(t)
	_, counter := startDaemon(t, nil)
	ns := newNamespace(t)
	target := ns + "-orion"
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: target}})
	})
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := gitSrv.Commit(ns, gitserver.DefaultBranch, schemaFiles(false), "unknown fields")
	if err != nil {
		t.Fatal(err)
	}
	createDeployment(t, c, ns, "orion", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, Ref: capstanv1.GitRef{Branch: "main"},
			SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(t, c, ns)},
		}},
		Path:       "clusters/orion",
		Substitute: map[string]string{"TARGET": target},
		Interval:   &metav1.Duration{Duration: 500 * time.Millisecond},
		Stages:     []capstanv1.StageSpec{{Name: "Namespace"}, {Name: "Infra"}},
	})
	cd := waitDeployment(t, c, ns, "orion", "Stalled by preflight", func(cd *capstanv1.ClusterDeployment) bool {
		stalled := condition(cd, capstanv1.ConditionStalled)
		return cd.Status.Revision == "main@sha1:"+rev && stalled != nil && stalled.Status == metav1.ConditionTrue
	})
	ready := condition(cd, capstanv1.ConditionReady)
	if ready.Status != metav1.ConditionFalse || ready.Reason != stages.PreflightReason {
		t.Errorf("Ready = %s/%s, want False/%s", ready.Status, ready.Reason, stages.PreflightReason)
	}
	for _, want := range []string{
		"ConfigMap " + target + "/settings: datas: schema check: the schema of v1 ConfigMap declares no such field",
		"Widget " + target + "/infra: spec.sise: schema check: the schema of test.capstan.dev/v1 Widget declares no such field",
		"(in clusters/orion/objects.yaml)",
	} {
		if !strings.Contains(ready.Message, want) {
			t.Errorf("Ready message does not contain %q:\n%s", want, ready.Message)
		}
	}
	// Zero objects created: no write but dry runs reached the target
	// namespace or the Namespace itself.
	for key, n := range counter.snapshot() {
		if strings.Contains(key, "(dry-run)") || strings.Contains(key, "/events") {
			continue
		}
		if strings.Contains(key, target) {
			t.Errorf("%d× %s: preflight let a write through", n, key)
		}
	}
	if err := c.Get(context.Background(), client.ObjectKey{Name: target}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
		t.Errorf("Namespace %s: %v, want it not created", target, err)
	}

	rev, err = gitSrv.Commit(ns, gitserver.DefaultBranch, schemaFiles(true), "fields fixed")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Widget infra created", func() (bool, error) {
		return object(t, c, widgetGVK, target, "infra") != nil, nil
	})
	setWidgetReady(t, c, target, "infra")
	waitDeployment(t, c, ns, "orion", "Ready at the fixed revision", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Revision == "main@sha1:"+rev && isReady(cd)
	})
}

// Six objects in a namespace nothing creates are one cause: the Ready
// message (what `capstan dev` and `capstan status` show) says it once,
// counting them, while status.preflight.problems keeps every object.
func TestPreflightGroupsProblemsByCause(t *testing.T) {
	c := newClient(t)
	startDaemon(t, nil)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	hosts := ""
	for i := range 6 {
		hosts += fmt.Sprintf("---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: host-%d\n  namespace: ${NS}-orion\n  labels: {capstan.dev/stage: HostsRegistered}\ndata: {a: b}\n", i)
	}
	rev, err := gitSrv.Commit(ns, gitserver.DefaultBranch, map[string]string{
		"clusters/orion/kustomization.yaml": "resources: [hosts.yaml]\n",
		"clusters/orion/hosts.yaml":         hosts,
	}, "no namespace")
	if err != nil {
		t.Fatal(err)
	}
	createDeployment(t, c, ns, "orion", capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, Ref: capstanv1.GitRef{Branch: "main"},
			SecretRef: &capstanv1.LocalObjectReference{Name: gitSecret(t, c, ns)},
		}},
		Path:       "clusters/orion",
		Substitute: map[string]string{"NS": ns},
		Interval:   &metav1.Duration{Duration: 500 * time.Millisecond},
		Stages:     []capstanv1.StageSpec{{Name: "HostsRegistered"}},
	})
	cd := waitDeployment(t, c, ns, "orion", "Stalled by preflight", func(cd *capstanv1.ClusterDeployment) bool {
		stalled := condition(cd, capstanv1.ConditionStalled)
		return cd.Status.Revision == "main@sha1:"+rev && stalled != nil && stalled.Status == metav1.ConditionTrue
	})
	msg := condition(cd, capstanv1.ConditionReady).Message
	want := "ERROR 6 objects (ConfigMap " + ns + "-orion/host-0, ConfigMap " + ns + "-orion/host-1, ConfigMap " + ns + "-orion/host-2 and 3 more): metadata.namespace: namespace " + ns + "-orion does not exist"
	if !strings.Contains(msg, want) || strings.Count(msg, "does not exist") != 1 {
		t.Errorf("Ready message does not say the cause once, as %q:\n%s", want, msg)
	}
	if p := cd.Status.Preflight; p == nil || p.Errors != 6 || len(p.Problems) != 6 {
		t.Errorf("status.preflight = %+v, want the 6 objects' errors", p)
	}
}

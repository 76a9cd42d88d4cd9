package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
)

// gadgetCRD is a CustomResourceDefinition of stage B, its schema
// described as desc: a CRD a revision changes.
func gadgetCRD(desc string) string {
	return `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: 'gadgets.${NS}.e2e.capstan.dev', labels: {capstan.dev/stage: B}}
spec:
  group: '${NS}.e2e.capstan.dev'
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget, listKind: GadgetList}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, description: ` + desc + `, x-kubernetes-preserve-unknown-fields: true}}
---
`
}

// skipObjects is twelve ConfigMaps of stage A, those named in changed
// with other data, and the Gadget CRD of stage B described as desc.
func skipObjects(desc string, changed ...string) string {
	var b strings.Builder
	for i := range 12 {
		name := fmt.Sprintf("cm-%02d", i)
		obj := cm(name, "A")
		for _, c := range changed {
			if c == name {
				obj = strings.Replace(obj, "data: {k: v}", "data: {k: changed}", 1)
			}
		}
		b.WriteString(obj)
	}
	return b.String() + gadgetCRD(desc)
}

// dryRunsOf counts the server-side dry runs of one ConfigMap.
func dryRunsOf(api *requestCounter, ns, name string) int {
	return api.total("PATCH(dry-run) /api/v1/namespaces/" + ns + "/configmaps/" + name)
}

// The preflight of a new revision sends no dry run for an object that
// the last walk applied with the same content and that nobody wrote
// since, and the apply then sends nothing for it either: a revision that
// changes 3 of 12 ConfigMaps dry-runs those 3 and the one edited by hand,
// applies the 3, and costs nothing for the others. A revision that
// changes a CRD of the plan dry-runs everything again.
func TestPreflightSkipsWhatDidNotChange(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	rev1, err := gitSrv.Commit(ns, gitserver.DefaultBranch, ownedRepo(skipObjects("one")), "v1")
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	_, api := startDaemonWith(t, nil, func(o *reconciler.Options) { o.Logger = logs.logger() })
	spec := ownedSpec(url, ns, gitSecret(t, c, ns), "A", "B")
	// Left behind when the test ends: deleting the CRD while a later test
	// runs would change the API groups its daemon maps kinds from.
	spec.DeletionPolicy = capstanv1.DeletionPolicyOrphan
	createDeployment(t, c, ns, "owned", spec)
	waitDeployment(t, c, ns, "owned", "Ready at v1", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Revision == "main@sha1:"+rev1 && isReady(cd)
	})

	// A field Capstan applied, taken over by hand, is drift: once it is
	// corrected, the drift watcher holds the ConfigMaps as they are. The
	// edit waits for the watch: one made before it is listed as it is,
	// with Capstan's entry already without data.k, and editing again
	// would not help, since Capstan no longer owns the field.
	waitDriftWatch(t, logs, "ConfigMap")
	hand := object(t, c, configMapGVK, ns, "cm-11")
	hand.Object["data"] = map[string]any{"k": "by hand"}
	if err := c.Update(context.Background(), hand, client.FieldOwner("e2e-hand")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "cm-11 corrected", func() (bool, error) {
		obj := object(t, c, configMapGVK, ns, "cm-11")
		return eventReasons(t, c, ns, "owned")["DriftCorrected"] > 0 && obj.Object["data"].(map[string]any)["k"] == "v", nil
	})
	// An annotation added by hand is no drift, but a write after
	// Capstan's apply: that object is dry-run again.
	edited := object(t, c, configMapGVK, ns, "cm-10")
	edited.SetAnnotations(map[string]string{"e2e.capstan.dev/note": "by hand"})
	if err := c.Update(context.Background(), edited, client.FieldOwner("e2e-hand")); err != nil {
		t.Fatal(err)
	}

	before := api.snapshot()
	since := func(name string) (dry, applied int) {
		path := "/api/v1/namespaces/" + ns + "/configmaps/" + name
		return dryRunsOf(api, ns, name) - before["PATCH(dry-run) "+path], api.total("PATCH "+path) - before["PATCH "+path]
	}
	rev2, err := gitSrv.Commit(ns, gitserver.DefaultBranch, ownedRepo(skipObjects("one", "cm-00", "cm-01", "cm-02")), "v2: change three")
	if err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c, ns, "owned", "Ready at v2", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Revision == "main@sha1:"+rev2 && isReady(cd)
	})
	for i := range 11 { // cm-11's correction may still be on its way to the watcher
		name := fmt.Sprintf("cm-%02d", i)
		dry, applied := since(name)
		switch {
		case i < 3:
			if dry != 1 || applied != 1 {
				t.Errorf("changed %s: %d dry runs and %d applies at v2, want 1 each", name, dry, applied)
			}
		case i == 10:
			if dry < 1 || applied != 0 {
				t.Errorf("%s, written by hand since: %d dry runs and %d applies at v2, want at least 1 and 0", name, dry, applied)
			}
		default:
			if dry != 0 || applied != 0 {
				t.Errorf("unchanged %s: %d dry runs and %d applies at v2, want none", name, dry, applied)
			}
		}
	}
	if got := object(t, c, configMapGVK, ns, "cm-00").Object["data"].(map[string]any)["k"]; got != "changed" {
		t.Errorf("cm-00 data.k = %v at v2, want changed", got)
	}

	// A CRD of the plan changes: every object is dry-run again.
	before = api.snapshot()
	rev3, err := gitSrv.Commit(ns, gitserver.DefaultBranch, ownedRepo(skipObjects("two", "cm-00", "cm-01", "cm-02")), "v3: change the CRD")
	if err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c, ns, "owned", "Ready at v3", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Revision == "main@sha1:"+rev3 && isReady(cd)
	})
	for i := range 12 {
		name := fmt.Sprintf("cm-%02d", i)
		if dry, applied := since(name); dry < 1 || applied != 0 {
			t.Errorf("%s at v3, whose CRD changed: %d dry runs and %d applies, want at least 1 and 0", name, dry, applied)
		}
	}
}

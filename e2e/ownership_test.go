package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
	"github.com/capstan-dev/capstan/stages"
)

var clusterGVK = schema.GroupVersionKind{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Cluster"}

// cm is a ConfigMap of stage in namespace ${NS}, as a repository holds it.
func cm(name, stage string, extra ...string) string {
	labels := "capstan.dev/stage: " + stage
	for _, e := range extra {
		labels += ", " + e
	}
	return fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s, namespace: '${NS}', labels: {%s}}\ndata: {k: v}\n---\n", name, labels)
}

func ownedRepo(objects string) map[string]string {
	return map[string]string{
		"clusters/owned/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [objects.yaml]\n",
		"clusters/owned/objects.yaml":       objects,
	}
}

// namespaceInA is a Namespace named ${NS}, applied by stage A: what a
// cluster reached through a kubeconfig needs before the objects in it.
const namespaceInA = "apiVersion: v1\nkind: Namespace\nmetadata: {name: '${NS}', labels: {capstan.dev/stage: A}}\n---\n"

// pushOwned creates the repository of namespace ns on the git server,
// pushes objects as the overlay ownedSpec reads, and returns its URL.
func pushOwned(t testing.TB, ns, objects string) string {
	t.Helper()
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, ownedRepo(objects), "v1"); err != nil {
		t.Fatal(err)
	}
	return url
}

func ownedSpec(url, ns, secret string, stageNames ...string) capstanv1.ClusterDeploymentSpec {
	spec := capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, SecretRef: &capstanv1.LocalObjectReference{Name: secret},
		}},
		Path:       "clusters/owned",
		Substitute: map[string]string{"NS": ns},
		Interval:   &metav1.Duration{Duration: 500 * time.Millisecond},
	}
	for _, name := range stageNames {
		spec.Stages = append(spec.Stages, capstanv1.StageSpec{Name: name})
	}
	return spec
}

// exists reports whether the object is there and not being deleted.
func exists(t testing.TB, c client.Client, gvk schema.GroupVersionKind, ns, name string) bool {
	t.Helper()
	obj := object(t, c, gvk, ns, name)
	return obj != nil && obj.GetDeletionTimestamp() == nil
}

func inventoryIDs(cd *capstanv1.ClusterDeployment) map[string]bool {
	return stages.InventoryIDs(cd.Status.Inventory)
}

// Prune: objects the source drops go once the new revision is Ready, in
// reverse stage order, each stage's gone before the one before it is
// touched; capstan.dev/prune: disabled keeps an object; a Cluster (a
// destructive kind) stays until the deployment allows it, and status and
// an event say what waits; deleting the deployment deletes the rest.
func TestPruneDeletesWhatTheSourceDropped(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	cluster := "apiVersion: cluster.x-k8s.io/v1beta2\nkind: Cluster\nmetadata: {name: doomed, namespace: '${NS}', labels: {capstan.dev/stage: A}}\nspec: {clusterNetwork: {pods: {cidrBlocks: [10.0.0.0/16]}}}\n---\n"
	v1 := cm("a-keep", "A") + cm("a-drop", "A") + cm("a-disabled", "A", "capstan.dev/prune: disabled") + cm("a-second", "A") + cluster +
		strings.Replace(cm("b-drop", "B"), "labels:", "finalizers: [e2e.capstan.dev/hold], labels:", 1)
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, ownedRepo(v1), "v1"); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, nil)
	createDeployment(t, c, ns, "owned", ownedSpec(url, ns, gitSecret(t, c, ns), "A", "B"))
	cd := waitDeployment(t, c, ns, "owned", "Ready", isReady)
	if n := len(inventoryIDs(cd)); n != 6 {
		t.Fatalf("inventory holds %d objects, want 6: %+v", n, cd.Status.Inventory)
	}
	if !controllerHasFinalizer(cd) {
		t.Errorf("finalizers = %v, want %s", cd.Finalizers, "capstan.dev/finalizer")
	}

	// v2 drops an object of stage A and all of stage B (from the source
	// and the plan): B's object goes first, and A's waits for it.
	v2 := cm("a-keep", "A") + cm("a-second", "A") + cluster
	rev2, err := gitSrv.Commit(ns, gitserver.DefaultBranch, ownedRepo(v2), "v2: drop a-drop, a-disabled and stage B")
	if err != nil {
		t.Fatal(err)
	}
	cd = getDeployment(t, c, ns, "owned")
	cd.Spec.Stages = cd.Spec.Stages[:1]
	if err := c.Update(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	cd = waitDeployment(t, c, ns, "owned", "pruning, held by b-drop's finalizer", func(cd *capstanv1.ClusterDeployment) bool {
		ready := condition(cd, capstanv1.ConditionReady)
		return ready != nil && ready.Reason == "Pruning" && strings.Contains(ready.Message, "ConfigMap/"+ns+"/b-drop")
	})
	if obj := object(t, c, configMapGVK, ns, "b-drop"); obj == nil || obj.GetDeletionTimestamp() == nil {
		t.Fatalf("b-drop is not being deleted: %v", obj)
	}
	if !exists(t, c, configMapGVK, ns, "a-drop") {
		t.Fatalf("a-drop (stage A) was pruned before b-drop (stage B, later) was gone: %s", describe(cd))
	}
	// The finalizer's controller lets b-drop go.
	held := object(t, c, configMapGVK, ns, "b-drop")
	held.SetFinalizers(nil)
	if err := c.Update(context.Background(), held); err != nil {
		t.Fatal(err)
	}
	cd = waitDeployment(t, c, ns, "owned", "Ready at v2", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Revision == "main@sha1:"+rev2 && isReady(cd)
	})
	for name, want := range map[string]bool{"a-keep": true, "a-second": true, "a-disabled": true, "a-drop": false, "b-drop": false} {
		if got := object(t, c, configMapGVK, ns, name) != nil; got != want {
			t.Errorf("ConfigMap %s exists = %v, want %v", name, got, want)
		}
	}
	ids := inventoryIDs(cd)
	if len(ids) != 3 || ids[ns+"_a-disabled__ConfigMap"] {
		t.Errorf("inventory after the prune = %v, want a-keep, a-second and the Cluster only", ids)
	}

	// v3 drops the Cluster and a-second: a destructive kind, so nothing
	// of the prune happens, and status says what waits.
	rev3, err := gitSrv.Commit(ns, gitserver.DefaultBranch, ownedRepo(cm("a-keep", "A")), "v3: drop the Cluster")
	if err != nil {
		t.Fatal(err)
	}
	cd = waitDeployment(t, c, ns, "owned", "Ready at v3 with the Cluster pending", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Revision == "main@sha1:"+rev3 && isReady(cd) && cd.Status.Inventory != nil && len(cd.Status.Inventory.PendingPrune) == 2
	})
	if msg := condition(cd, capstanv1.ConditionReady).Message; !strings.Contains(msg, "spec.prune.destructive") {
		t.Errorf("Ready message = %q, want it to say what the held objects wait for", msg)
	}
	if !exists(t, c, clusterGVK, ns, "doomed") || !exists(t, c, configMapGVK, ns, "a-second") {
		t.Fatal("a prune that holds a Cluster deleted something")
	}
	waitFor(t, "PrunePending event", func() (bool, error) { return eventReasons(t, c, ns, "owned")["PrunePending"] > 0, nil })

	cd = getDeployment(t, c, ns, "owned")
	cd.Spec.Prune = &capstanv1.PruneSpec{Destructive: true}
	if err := c.Update(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	waitDeployment(t, c, ns, "owned", "Ready with nothing pending", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.ObservedGeneration == cd.Generation && isReady(cd) && len(cd.Status.Inventory.PendingPrune) == 0
	})
	waitFor(t, "the Cluster and a-second pruned", func() (bool, error) {
		return !exists(t, c, clusterGVK, ns, "doomed") && object(t, c, configMapGVK, ns, "a-second") == nil, nil
	})

	// Deleting the deployment deletes what it applied, and then it goes.
	if err := c.Delete(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deployment and a-keep deleted", func() (bool, error) {
		err := c.Get(context.Background(), client.ObjectKeyFromObject(cd), &capstanv1.ClusterDeployment{})
		return apierrors.IsNotFound(err) && object(t, c, configMapGVK, ns, "a-keep") == nil, nil
	})
	if object(t, c, configMapGVK, ns, "a-disabled") == nil {
		t.Error("a-disabled (capstan.dev/prune: disabled) was deleted")
	}
}

// A deployment that applies the Namespace it lives in, and may delete
// destructive kinds, is deleted: its other objects go, the Namespace stays
// (deleting it would delete the deployment while its finalizer waits for
// the Namespace to go), an event says why, and the deployment is gone.
func TestDeletingADeploymentKeepsTheNamespaceItLivesIn(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url := pushOwned(t, ns, namespaceInA+cm("settings", "A"))
	startDaemon(t, nil)
	spec := ownedSpec(url, ns, gitSecret(t, c, ns), "A")
	spec.Prune = &capstanv1.PruneSpec{Destructive: true}
	createDeployment(t, c, ns, "self", spec)
	cd := waitDeployment(t, c, ns, "self", "Ready", isReady)
	if !inventoryIDs(cd)["_"+ns+"__Namespace"] {
		t.Fatalf("the inventory does not hold Namespace %s: %v", ns, inventoryIDs(cd))
	}

	if err := c.Delete(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deployment and its ConfigMap gone", func() (bool, error) {
		err := c.Get(context.Background(), client.ObjectKeyFromObject(cd), &capstanv1.ClusterDeployment{})
		return apierrors.IsNotFound(err) && object(t, c, configMapGVK, ns, "settings") == nil, client.IgnoreNotFound(err)
	})
	if !exists(t, c, schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}, "", ns) {
		t.Errorf("Namespace %s, which held the deployment, was deleted", ns)
	}
	waitFor(t, "a PruneSkipped event saying why the Namespace stays", func() (bool, error) {
		list := &eventsv1.EventList{}
		if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Reason == "PruneSkipped" && strings.Contains(e.Note, "Namespace/"+ns) && strings.Contains(e.Note, "holds ClusterDeployment "+ns+"/self") {
				return true, nil
			}
		}
		return false, nil
	})
}

func controllerHasFinalizer(cd *capstanv1.ClusterDeployment) bool {
	for _, f := range cd.Finalizers {
		if f == "capstan.dev/finalizer" {
			return true
		}
	}
	return false
}

// appliesTo counts the server-side applies of one object. Dry runs are
// counted under "PATCH(dry-run) ...", which the pattern does not match.
func appliesTo(api *requestCounter, ns, resource, name string) int {
	return api.total("PATCH /api/v1/namespaces/" + ns + "/" + resource + "/" + name)
}

// Drift: an applied object deleted, and a field Capstan applied changed by
// another field manager, are both restored, with one apply each; a
// deployment that says report only reports; and a Ready deployment with
// nothing changed makes no API request.
func TestDriftIsCorrected(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, ownedRepo(cm("deleted", "A")+cm("edited", "A")), "v1"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	_, api := startDaemonWith(t, nil, func(o *reconciler.Options) { o.MetricsRegistry = reg })
	createDeployment(t, c, ns, "owned", ownedSpec(url, ns, gitSecret(t, c, ns), "A"))
	waitDeployment(t, c, ns, "owned", "Ready", isReady)
	assertDriftCorrected(t, driftRun{client: c, ns: ns, api: api, reg: reg, objects: c, objectsAPI: api})
}

// driftCount reads capstan_drift_corrections_total of a deployment and
// action from reg.
func driftCount(t testing.TB, reg *prometheus.Registry, ns, name, action string) float64 {
	t.Helper()
	return metricValue(t, reg, "capstan_drift_corrections_total", map[string]string{"namespace": ns, "cluster": name, "action": action}, 0)
}

// eventOccurrences counts how often events of reason on deployment name
// were recorded as the API server has them: an event repeated with the
// same regarding object folds into the first one's series, whose count
// the recorder writes at the second occurrence (an update, after the
// create) and then only every half hour.
func eventOccurrences(t testing.TB, c client.Client, ns, name, reason string) int {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		if e.Regarding.Name != name || e.Reason != reason {
			continue
		}
		if e.Series != nil {
			n += int(e.Series.Count)
		} else {
			n++
		}
	}
	return n
}

func eventMessages(t testing.TB, c client.Client, ns, name, reason string) string {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return strings.Join(out, "\n")
}

// One owner per object: a second deployment declaring an object of the
// first fails, naming both, and applies nothing of that stage; the first
// stays Ready and its object as it applied it. A readiness message that
// reads a Secret's data writes no Secret value anywhere.
func TestOneOwnerPerObject(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, ownedRepo(cm("shared", "A")), "first"); err != nil {
		t.Fatal(err)
	}
	second := map[string]string{
		"clusters/second/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [objects.yaml]\n",
		"clusters/second/objects.yaml": strings.ReplaceAll(cm("own", "A")+cm("shared", "A"), "{k: v}", "{k: second}") +
			"apiVersion: v1\nkind: Secret\nmetadata: {name: creds, namespace: '${NS}', labels: {capstan.dev/stage: S}}\nstringData: {password: planted-s3cret-value}\n",
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, second, "second"); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, nil)
	secret := gitSecret(t, c, ns)
	createDeployment(t, c, ns, "first", ownedSpec(url, ns, secret, "A"))
	waitDeployment(t, c, ns, "first", "Ready", isReady)

	spec := ownedSpec(url, ns, secret, "S", "A")
	spec.Path = "clusters/second"
	// A check that cannot see the Secret's data, with a message that
	// tries to print it: the stage waits, and says nothing of the value.
	spec.Stages[0].ReadyWhen = []capstanv1.ReadinessCheck{{
		Kind: "Secret", CEL: "has(object.data)", MessageExpression: "'data: ' + string(object.data) + string(object.stringData)",
	}}
	createDeployment(t, c, ns, "second", spec)
	cd := waitDeployment(t, c, ns, "second", "stage S waiting", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "S").State == capstanv1.StageInProgress && stage(cd, "S").Message != "" && !strings.HasPrefix(stage(cd, "S").Message, "applied")
	})
	t.Logf("stage S waits: %s", stage(cd, "S").Message)

	// Let stage S pass, so that stage A meets the first deployment's object.
	cd.Spec.Stages[0].ReadyWhen = nil
	if err := c.Update(context.Background(), cd); err != nil {
		t.Fatal(err)
	}
	cd = waitDeployment(t, c, ns, "second", "Stalled on the shared object", func(cd *capstanv1.ClusterDeployment) bool {
		st := condition(cd, capstanv1.ConditionStalled)
		return cd.Status.ObservedGeneration == cd.Generation && st != nil && st.Status == metav1.ConditionTrue
	})
	msg := condition(cd, capstanv1.ConditionReady).Message
	for _, want := range []string{"ConfigMap/" + ns + "/shared", ns + "/first", ns + "/second"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Ready message %q does not name %s", msg, want)
		}
	}
	if object(t, c, configMapGVK, ns, "own") != nil {
		t.Error("the stage with the conflict applied its other object")
	}
	shared := object(t, c, configMapGVK, ns, "shared")
	if shared.GetLabels()[stages.OwnerNameLabel] != "first" || shared.Object["data"].(map[string]any)["k"] != "v" {
		t.Errorf("the first deployment's object changed: %v", shared.Object)
	}
	if first := getDeployment(t, c, ns, "first"); !isReady(first) {
		t.Errorf("the first deployment is no longer Ready: %s", describe(first))
	}

	// The planted Secret value is nowhere: status, events.
	cd = getDeployment(t, c, ns, "second")
	raw := fmt.Sprintf("%+v", cd.Status)
	list := &eventsv1.EventList{}
	if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		raw += e.Note
	}
	for _, planted := range []string{"planted-s3cret-value", "cGxhbnRlZC1zM2NyZXQtdmFsdWU="} {
		if strings.Contains(raw, planted) {
			t.Errorf("the Secret's value %q appears in status or events", planted)
		}
	}
}

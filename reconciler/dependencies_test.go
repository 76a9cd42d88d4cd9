package reconciler

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
)

// dependent is a deployment in namespace team that reads the same source
// as every other of these tests, at revision main@sha1:2.
func dependent(name string, deps ...capstanv1.DependencyReference) *capstanv1.ClusterDeployment {
	return &capstanv1.ClusterDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team", Generation: 1},
		Spec: capstanv1.ClusterDeploymentSpec{
			Source:    &capstanv1.SourceSpec{Git: &capstanv1.GitSource{URL: "https://git.example/infra.git", Ref: capstanv1.GitRef{Branch: "main"}}},
			Path:      "clusters/" + name,
			DependsOn: deps,
		},
	}
}

// readyAt makes cd Ready at revision rev and its current generation.
func readyAt(cd *capstanv1.ClusterDeployment, rev string) *capstanv1.ClusterDeployment {
	cd.Status.Revision, cd.Status.ObservedGeneration = rev, cd.Generation
	cd.Status.Conditions = []metav1.Condition{{Type: capstanv1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Succeeded",
		LastTransitionTime: metav1.Now()}}
	return cd
}

func on(names ...string) []capstanv1.DependencyReference {
	out := make([]capstanv1.DependencyReference, len(names))
	for i, n := range names {
		ns, name, ok := strings.Cut(n, "/")
		if !ok {
			ns, name = "", n
		}
		out[i] = capstanv1.DependencyReference{Namespace: ns, Name: name}
	}
	return out
}

// A deployment waits, applying nothing, until every deployment it depends
// on is Ready at its generation and at the revision its source has now;
// the message names each one it waits for and why, and a cycle is named
// as one.
func TestCheckDependencies(t *testing.T) {
	const rev = "main@sha1:2"
	cases := []struct {
		name   string
		deps   []capstanv1.DependencyReference
		others []client.Object
		// reason is the wait's reason, "" when the attempt goes on.
		reason string
		says   []string
	}{
		{name: "no dependencies"},
		{name: "ready at the revision", deps: on("network"), others: []client.Object{readyAt(dependent("network"), rev)}},
		{name: "ready in another namespace", deps: on("infra/network"),
			others: []client.Object{readyAt(func() *capstanv1.ClusterDeployment { d := dependent("network"); d.Namespace = "infra"; return d }(), rev)}},
		{name: "missing", deps: on("network"), reason: ReasonDependencyNotReady,
			says: []string{"waiting for ClusterDeployment team/network (not found) to be Ready"}},
		{name: "not ready", deps: on("network"), others: []client.Object{dependent("network")}, reason: ReasonDependencyNotReady,
			says: []string{"team/network to be Ready"}},
		{name: "ready at an older generation", deps: on("network"),
			others: []client.Object{func() *capstanv1.ClusterDeployment {
				d := readyAt(dependent("network"), rev)
				d.Generation = 2
				return d
			}()},
			reason: ReasonDependencyNotReady, says: []string{"team/network to be Ready"}},
		{name: "ready behind its source", deps: on("network"), others: []client.Object{readyAt(dependent("network"), "main@sha1:1")},
			reason: ReasonDependencyNotReady, says: []string{"team/network (Ready at main@sha1:1, its source is at main@sha1:2)"}},
		{name: "suspended behind its source", deps: on("network"),
			others: []client.Object{func() *capstanv1.ClusterDeployment {
				d := readyAt(dependent("network"), "main@sha1:1")
				d.Spec.Suspend = true
				return d
			}()}},
		{name: "two of three waited for", deps: on("network", "storage", "dns"),
			others: []client.Object{readyAt(dependent("network"), rev), dependent("storage")}, reason: ReasonDependencyNotReady,
			says: []string{"team/storage, team/dns (not found) to be Ready"}},
		{name: "a cycle", deps: on("network"), others: []client.Object{dependent("network", on("storage")...), dependent("storage", on("app")...)},
			reason: ReasonDependencyCycle, says: []string{"team/app -> team/network -> team/storage -> team/app", "remove one of the dependsOn entries"}},
		{name: "a cycle it is not part of waits as usual", deps: on("network"),
			others: []client.Object{dependent("network", on("storage")...), dependent("storage", on("network")...)},
			reason: ReasonDependencyNotReady, says: []string{"team/network to be Ready"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cd := dependent("app", tc.deps...)
			r := &Reconciler{client: fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(append(tc.others, cd)...).Build()}
			done, err := r.checkDependencies(context.Background(), &attempt{cd: cd, revision: rev})
			if done {
				t.Error("checkDependencies ended the attempt as done; it only ever waits")
			}
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("want no wait, got %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("want a wait (%s), got none", tc.reason)
			}
			if got := failure.ReasonOf(err, ""); got != tc.reason || failure.PolicyOf(err) != failure.PolicyWait {
				t.Errorf("reason %s, policy %s; want %s, %s", got, failure.PolicyOf(err), tc.reason, failure.PolicyWait)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the message does not say %q:\n%s", s, err)
				}
			}
		})
	}
}

// A Ready deployment that corrects drift keeps what it applied, whatever
// its dependencies do now.
func TestCheckDependenciesLetsDriftCorrectionThrough(t *testing.T) {
	cd := dependent("app", on("network")...)
	r := &Reconciler{client: fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(cd).Build()}
	if _, err := r.checkDependencies(context.Background(), &attempt{cd: cd, driftOnly: true}); err != nil {
		t.Errorf("drift correction waited for a missing dependency: %v", err)
	}
}

func TestDependsOnKeys(t *testing.T) {
	cd := dependent("app", on("network", "infra/dns")...)
	if got, want := dependsOnKeys(cd), []string{"team/network", "infra/dns"}; !slices.Equal(got, want) {
		t.Errorf("dependsOnKeys = %v, want %v", got, want)
	}
	if got := dependsOnKeys(dependent("app")); got != nil {
		t.Errorf("dependsOnKeys without dependencies = %v, want none", got)
	}
	if got := dependsOnKeys(&corev1.ConfigMap{}); got != nil {
		t.Errorf("dependsOnKeys of another kind = %v, want none", got)
	}
}

// Only a flip of readiness, or a Ready deployment moving to another
// revision, wakes the deployments that depend on it: the status writes
// of a walk in progress do not.
func TestReadinessChanged(t *testing.T) {
	notReady := dependent("network")
	ready1 := readyAt(dependent("network"), "main@sha1:1")
	ready2 := readyAt(dependent("network"), "main@sha1:2")
	progressing := dependent("network")
	progressing.Status.CurrentStage = "Workers"
	cases := []struct {
		name     string
		old, cur *capstanv1.ClusterDeployment
		want     bool
	}{
		{"becomes ready", notReady, ready1, true},
		{"stops being ready", ready1, notReady, true},
		{"ready at another revision", ready1, ready2, true},
		{"a walk in progress moves on", notReady, progressing, false},
		{"ready, unchanged", ready1, ready1.DeepCopy(), false},
	}
	for _, tc := range cases {
		if got := readinessChanged.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.cur}); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if !readinessChanged.Create(event.CreateEvent{Object: ready1}) || !readinessChanged.Delete(event.DeleteEvent{Object: ready1}) {
		t.Error("a deployment created or deleted must wake its dependents")
	}
	if readinessChanged.Generic(event.GenericEvent{Object: ready1}) {
		t.Error("a generic event woke the dependents")
	}
}

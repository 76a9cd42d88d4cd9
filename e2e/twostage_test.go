package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/gitserver"
	"github.com/capstan-dev/capstan/reconciler"
)

// twoStageFiles is an overlay whose first stage holds a Widget that only a
// controller (here: the test) can make ready, and whose second stage must
// wait for it.
func twoStageFiles(appVersion string) map[string]string {
	return map[string]string{
		"clusters/two-stage/kustomization.yaml": `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [infra.yaml, app.yaml]
`,
		"clusters/two-stage/infra.yaml": `apiVersion: test.capstan.dev/v1
kind: Widget
metadata:
  name: infra
  namespace: ${NS}
  labels: {capstan.dev/stage: Infra}
spec: {size: 3}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: infra-settings
  namespace: ${NS}
  labels: {capstan.dev/stage: Infra}
data: {podCIDR: 10.233.0.0/16}
`,
		"clusters/two-stage/app.yaml": `apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
  namespace: ${NS}
  labels: {capstan.dev/stage: App}
data: {version: "` + appVersion + `"}
`,
	}
}

func twoStageSpec(url, ns, secret string) capstanv1.ClusterDeploymentSpec {
	return capstanv1.ClusterDeploymentSpec{
		Source: &capstanv1.SourceSpec{Git: &capstanv1.GitSource{
			URL: url, Ref: capstanv1.GitRef{Branch: "main"},
			SecretRef: &capstanv1.LocalObjectReference{Name: secret},
		}},
		Path:       "clusters/two-stage",
		Substitute: map[string]string{"NS": ns},
		Interval:   &metav1.Duration{Duration: 500 * time.Millisecond},
		Stages: []capstanv1.StageSpec{
			{Name: "Infra", ReadyWhen: []capstanv1.ReadinessCheck{{
				Kind: "Widget", CEL: "object.status.ready == true", Message: "waiting for the widget controller",
			}}},
			{Name: "App"},
		},
	}
}

func TestTwoStageOverlayFromGit(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	first, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("1"), "two-stage overlay")
	if err != nil {
		t.Fatal(err)
	}
	d, api := startDaemon(t, nil)
	createDeployment(t, c, ns, "two", twoStageSpec(url, ns, gitSecret(t, c, ns)))
	begin := time.Now()

	// Stage 1 is applied and waits; the daemon keeps looking at it: the
	// first attempt lists the widgets at its first look and for the rest
	// of its wait slice, the next walk lists them again. Waiting is one
	// attempt, however many walks it takes.
	cd := waitDeployment(t, c, ns, "two", "stage Infra in progress, looked at by a second walk", func(cd *capstanv1.ClusterDeployment) bool {
		return stage(cd, "Infra").State == capstanv1.StageInProgress && api.listsOf("/namespaces/"+ns+"/widgets") >= 3
	})
	if n := stage(cd, "Infra").Attempts; n != 1 {
		t.Errorf("stage Infra: %d attempts after waiting over several walks, want 1: waiting is not a new attempt", n)
	}
	if object(t, c, widgetGVK, ns, "infra") == nil || object(t, c, configMapGVK, ns, "infra-settings") == nil {
		t.Fatalf("stage Infra is in progress but its objects are not all applied: %s", describe(cd))
	}
	if object(t, c, configMapGVK, ns, "app-config") != nil {
		t.Fatalf("stage App's ConfigMap was applied before stage Infra was ready: %s", describe(cd))
	}
	// The second attempt waits with the plan of the first: one render.
	if n := d.Reconciler().Stats().Renders; n != 1 {
		t.Errorf("%d renders of one revision while its stage waits, want 1", n)
	}
	if got := stage(cd, "App").State; got != capstanv1.StagePending {
		t.Errorf("stage App = %s while Infra waits, want Pending", got)
	}
	if want := "main@sha1:" + first; cd.Status.Revision != want {
		t.Errorf("status.revision = %q, want %q", cd.Status.Revision, want)
	}
	if msg := stage(cd, "Infra").Message; !strings.Contains(msg, "Widget/"+ns+"/infra") || !strings.Contains(msg, "waiting for the widget controller") {
		t.Errorf("stage Infra message = %q, want it to name the Widget and what it waits for", msg)
	}

	// The widget controller marks it ready: stage 2 follows.
	readyAt := time.Now()
	setWidgetReady(t, c, ns, "infra")
	cd = waitDeployment(t, c, ns, "two", "Ready", isReady)
	t.Logf("Infra ready -> deployment Ready in %s; whole plan in %s", time.Since(readyAt), time.Since(begin))
	if object(t, c, configMapGVK, ns, "app-config") == nil {
		t.Fatal("deployment Ready but stage App's ConfigMap is missing")
	}
	infra, app := stage(cd, "Infra"), stage(cd, "App")
	for _, st := range []capstanv1.StageStatus{infra, app} {
		if st.State != capstanv1.StageReady || st.StartedAt == nil || st.FinishedAt == nil {
			t.Fatalf("stage %s = %+v, want Ready with start and finish times", st.Name, st)
		}
	}
	if app.StartedAt.Before(infra.FinishedAt) {
		t.Errorf("stage App started at %s, before Infra finished at %s", app.StartedAt, infra.FinishedAt)
	}
	if cd.Status.CurrentStage != "" {
		t.Errorf("currentStage = %q after all stages are ready", cd.Status.CurrentStage)
	}

	// Every transition is told by an event on the ClusterDeployment:
	// Infra, which waited, by its start and its end; App, started and
	// ready in the walk that made the deployment Ready, by the Ready
	// event alone (one event, not three: docs/decisions.md).
	waitFor(t, "stage events", func() (bool, error) {
		reasons := eventReasons(t, c, ns, "two")
		return reasons["StageInProgress"] == 1 && reasons["StageReady"] == 1 && reasons["Ready"] == 1, nil
	})
	if msg := eventMessage(t, c, ns, "two", "Ready"); !strings.Contains(msg, "all 2 stages ready") || !strings.Contains(msg, "stage App started at") {
		t.Errorf("Ready event %q, want it to tell the stages ready and App's start and end", msg)
	}
}

// eventMessage returns the note of the newest event of reason about the
// deployment, "" when there is none.
func eventMessage(t testing.TB, c client.Client, ns, name, reason string) string {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var msg string
	var at time.Time
	for _, e := range list.Items {
		if e.Regarding.Kind == capstanv1.ClusterDeploymentKind && e.Regarding.Name == name && e.Reason == reason && !e.EventTime.Time.Before(at) {
			msg, at = e.Note, e.EventTime.Time
		}
	}
	return msg
}

func eventReasons(t testing.TB, c client.Client, ns, name string) map[string]int {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range list.Items {
		if e.Regarding.Kind == capstanv1.ClusterDeploymentKind && e.Regarding.Name == name {
			out[e.Reason]++
		}
	}
	return out
}

func TestNewCommitIsAppliedAndUnchangedRemoteIsANoop(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("1"), "v1"); err != nil {
		t.Fatal(err)
	}
	d, api := startDaemon(t, nil)
	createDeployment(t, c, ns, "two", twoStageSpec(url, ns, gitSecret(t, c, ns)))
	waitFor(t, "Widget infra", func() (bool, error) { return object(t, c, widgetGVK, ns, "infra") != nil, nil })
	setWidgetReady(t, c, ns, "infra")
	waitDeployment(t, c, ns, "two", "Ready", isReady)

	// A new commit: rendered, applied, recorded.
	second, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("2"), "bump app to 2")
	if err != nil {
		t.Fatal(err)
	}
	cd := waitDeployment(t, c, ns, "two", "Ready at the new revision", func(cd *capstanv1.ClusterDeployment) bool {
		return cd.Status.Revision == "main@sha1:"+second && isReady(cd)
	})
	if v := object(t, c, configMapGVK, ns, "app-config").Object["data"].(map[string]any)["version"]; v != "2" {
		t.Fatalf("app-config version = %v after the new commit, want 2: %s", v, describe(cd))
	}

	// The Ready event is recorded after the status says Ready: its write
	// would count among the requests below.
	waitFor(t, "the Ready event of the new revision", func() (bool, error) {
		return strings.Contains(eventMessages(t, c, ns, "two", "Ready"), second), nil
	})

	// Nothing moves: polls cost one ls-remote each, and no render, no fetch,
	// no API request at all (the deployment comes from the informer cache,
	// the credentials from the source cache).
	stats, writes, requests := d.Reconciler().Stats(), api.snapshot(), api.all()
	infoRefs := "/" + ns + ".git/info/refs"
	polls := gitSrv.RequestsTo(infoRefs)
	waitFor(t, "three more polls of the remote", func() (bool, error) {
		return gitSrv.RequestsTo(infoRefs) >= polls+3, nil
	})
	if after := d.Reconciler().Stats(); after != stats {
		t.Errorf("unchanged remote: stats went from %+v to %+v, want no fetch and no render", stats, after)
	}
	if after := api.snapshot(); !equalCounts(writes, after) {
		t.Errorf("unchanged remote: API writes went from %v to %v, want none", writes, after)
	}
	if n := api.all() - requests; n != 0 {
		t.Errorf("unchanged remote: %d API requests (reads included) during three polls, want 0", n)
	}
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// A stage just applied says what it waits for within seconds, not at the
// end of a long wait slice: the first look is short.
func TestAppliedStageSaysWhatItWaitsForSoon(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t)
	url, err := gitSrv.CreateRepo(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gitSrv.Commit(ns, gitserver.DefaultBranch, twoStageFiles("1"), "two-stage overlay"); err != nil {
		t.Fatal(err)
	}
	startDaemonWith(t, nil, func(o *reconciler.Options) { o.Reconciler.WaitSlice = 10 * time.Minute })
	createDeployment(t, c, ns, "two", twoStageSpec(url, ns, gitSecret(t, c, ns)))
	begin := time.Now()
	waitDeployment(t, c, ns, "two", "stage Infra saying what it waits for", func(cd *capstanv1.ClusterDeployment) bool {
		return strings.Contains(stage(cd, "Infra").Message, "waiting for the widget controller")
	})
	t.Logf("applied stage -> status says what it waits for in %s (wait slice 10m)", time.Since(begin).Round(time.Millisecond))
}

package stages_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/pkg/ssa"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// requestCounts sorts requests into what the apply cost tests count.
type requestCounts struct {
	lists, gets, dryRuns, applies, deletes, other int
}

func countRequests(reqs []request) requestCounts {
	var c requestCounts
	for _, r := range reqs {
		switch {
		case r.method == http.MethodGet && isDiscovery(r.path):
			// The client's first look at what the cluster serves.
		case r.method == http.MethodGet && strings.HasSuffix(r.path, "/configmaps"):
			c.lists++
		case r.method == http.MethodGet:
			c.gets++
		case r.method == http.MethodPatch && r.dryRun:
			c.dryRuns++
		case r.method == http.MethodPatch:
			c.applies++
		case r.method == http.MethodDelete:
			c.deletes++
		default:
			c.other++
		}
	}
	return c
}

// isDiscovery reports a path of the discovery API: /api, /api/v1, /apis,
// /apis/GROUP and /apis/GROUP/VERSION.
func isDiscovery(path string) bool {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch parts[0] {
	case "api":
		return len(parts) <= 2
	case "apis":
		return len(parts) <= 3
	}
	return false
}

func configMaps(ns string, n int, value string) []*unstructured.Unstructured {
	objs := make([]*unstructured.Unstructured, n)
	for i := range objs {
		objs[i] = configMap(ns, fmt.Sprintf("cm-%02d", i), map[string]any{"v": value})
	}
	return objs
}

// TestApplyCostsOneRequestPerObject: the executor reads the live objects of
// a kind with one LIST, then a new object costs its apply, an unchanged one
// its dry run, a changed one the dry run and the apply.
func TestApplyCostsOneRequestPerObject(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	e := stages.NewExecutor(c)
	const n = 20

	mark := log.mark()
	cs, err := e.Apply(ctx, configMaps(ns, n, "a"), "Config", owner)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(cs.ToGroupedMap()[ssa.CreatedAction]); got != n {
		t.Errorf("created %d, want %d", got, n)
	}
	if got, want := countRequests(log.since(mark)), (requestCounts{lists: 1, applies: n}); got != want {
		t.Errorf("new objects: requests %+v, want %+v", got, want)
	}

	mark = log.mark()
	cs, err = e.Apply(ctx, configMaps(ns, n, "a"), "Config", owner)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(cs.ToGroupedMap()[ssa.UnchangedAction]); got != n {
		t.Errorf("unchanged %d, want %d", got, n)
	}
	if got, want := countRequests(log.since(mark)), (requestCounts{lists: 1, dryRuns: n}); got != want {
		t.Errorf("unchanged objects: requests %+v, want %+v", got, want)
	}

	changed := configMaps(ns, n, "a")
	changed[3] = configMap(ns, "cm-03", map[string]any{"v": "b"})
	mark = log.mark()
	cs, err = e.Apply(ctx, changed, "Config", owner)
	if err != nil {
		t.Fatal(err)
	}
	if got := cs.ToGroupedMap()[ssa.ConfiguredAction]; len(got) != 1 {
		t.Errorf("configured %v, want only cm-03", got)
	}
	if got, want := countRequests(log.since(mark)), (requestCounts{lists: 1, dryRuns: n, applies: 1}); got != want {
		t.Errorf("one changed object: requests %+v, want %+v", got, want)
	}
}

// TestApplyTakesBackAWaveWithAnInvalidObject: when one new object of a wave
// is refused, the objects the wave created are deleted again, and the
// objects that existed are not touched.
func TestApplyTakesBackAWaveWithAnInvalidObject(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	e := stages.NewExecutor(c)
	before := configMaps(ns, 4, "old")
	if _, err := e.Apply(ctx, before, "Config", owner); err != nil {
		t.Fatal(err)
	}

	wave := configMaps(ns, 12, "new")
	wave = append(wave, configMap(ns, "numeric", map[string]any{"count": int64(3)}))
	mark := log.mark()
	_, err := e.Apply(ctx, wave, "Config", owner)
	if !stages.IsStalled(err) || !strings.Contains(fmt.Sprint(err), "ConfigMap/"+ns+"/numeric") {
		t.Fatalf("Apply = %v, want a stalled error naming ConfigMap/%s/numeric", err, ns)
	}
	// The four that existed are valid, but the wave failed: their new
	// value must not be applied.
	for _, obj := range before {
		if got := getLive(t, c, obj).Object["data"].(map[string]any)["v"]; got != "old" {
			t.Errorf("%s: v = %v, want old: a failed wave changed an existing object", stages.ObjectRef(obj), got)
		}
	}
	for _, obj := range wave[4:] {
		err := c.Get(ctx, client.ObjectKeyFromObject(obj), &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}})
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s: %v, want NotFound: a wave that failed leaves nothing it created", stages.ObjectRef(obj), err)
		}
	}
	got := countRequests(log.since(mark))
	if got.deletes != 8 {
		t.Errorf("deleted %d objects, want the 8 the wave created (requests %+v)", got.deletes, got)
	}
}

// TestApplyRefusesAnotherDeploymentsObjectFromTheList: the ownership check
// works from the LIST the executor reads, as from a GET.
func TestApplyRefusesAnotherDeploymentsObjectFromTheList(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	installDeploymentCRD(t, c)
	e := stages.NewExecutor(c)
	first := stages.Owner{Name: "first", Namespace: ns}
	createDeployment(t, c, first)
	if _, err := e.Apply(ctx, configMaps(ns, 10, "a")[9:], "Config", first); err != nil {
		t.Fatal(err)
	}
	mark := log.mark()
	_, err := e.Apply(ctx, configMaps(ns, 10, "b"), "Config", owner)
	want := "ConfigMap/" + ns + "/cm-09 belongs to ClusterDeployment " + first.Namespace + "/" + first.Name
	if !stages.IsStalled(err) || !strings.Contains(fmt.Sprint(err), want) {
		t.Fatalf("Apply = %v, want a stalled error with %q", err, want)
	}
	if writes := log.writesSince(mark, true); len(writes) > 0 {
		t.Errorf("a wave with a conflict sent writes (dry runs included): %v", writes)
	}
	for _, obj := range configMaps(ns, 9, "b") {
		err := c.Get(ctx, client.ObjectKeyFromObject(obj), &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}})
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s: %v, want NotFound: nothing of a refused wave is applied", stages.ObjectRef(obj), err)
		}
	}
}

// TestRunReadyFromTheApplyAnswers: a stage whose objects are ready as the
// apply returns them (ConfigMaps) is Ready without a LIST or a watch; the
// attempt ends with the apply, so its result carries the apply and
// Progress hears nothing.
func TestRunReadyFromTheApplyAnswers(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	e := stages.NewExecutor(c)
	stage := &stages.Stage{
		StageSpec: capstanv1.StageSpec{Name: "Config", Action: capstanv1.StageActionApply},
		Objects:   configMaps(ns, 12, "a"),
	}
	for _, round := range []string{"new", "unchanged"} {
		var reported []stages.Result
		mark := log.mark()
		res := e.Run(ctx, stage, owner, stages.RunOptions{
			Wait:      time.Minute,
			FirstLook: time.Second,
			Progress: func(r stages.Result) error {
				reported = append(reported, r)
				return nil
			},
		})
		if res.State != capstanv1.StageReady || !res.Applied {
			t.Fatalf("%s: Run = %s (applied %v): %s", round, res.State, res.Applied, res.Message)
		}
		if len(reported) != 0 || res.ChangeSet == nil || len(res.ChangeSet.Entries) != len(stage.Objects) {
			t.Errorf("%s: progress reports = %+v, change set %v; want no report (the attempt ends with the apply) and the apply's change set in the result", round, reported, res.ChangeSet)
		}
		for _, r := range log.since(mark) {
			if r.watch {
				t.Errorf("%s: the stage was watched (%s); the apply's answers showed it ready", round, r)
			}
		}
		if got := countRequests(log.since(mark)).lists; got != 1 {
			t.Errorf("%s: %d LISTs, want 1 (the look before the apply)", round, got)
		}
	}
}

// TestRunReportsTheFirstLook: an attempt at a stage that is not ready says
// what it waits for through Progress after the first look, then goes on
// waiting; a Progress error ends the attempt.
func TestRunReportsTheFirstLook(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, _ := newClient(t)
	e := stages.NewExecutor(c)
	stage := widgetStage(widget(ns, "slow", map[string]any{"size": int64(1)}))

	var reported []stages.Result
	res := e.Run(ctx, stage, owner, stages.RunOptions{
		Wait:      2 * time.Second,
		FirstLook: 200 * time.Millisecond,
		Progress: func(r stages.Result) error {
			reported = append(reported, r)
			return nil
		},
	})
	if res.State != capstanv1.StageInProgress || !strings.Contains(res.Message, "Widget/"+ns+"/slow") {
		t.Errorf("Run = %s %q, want InProgress waiting for the widget", res.State, res.Message)
	}
	if len(reported) != 2 || !reported[0].Applied || !strings.Contains(reported[1].Message, "Widget/"+ns+"/slow") {
		t.Fatalf("progress reports = %+v, want the apply, then what the first look waits for", reported)
	}

	stop := errors.New("status write failed")
	calls := 0
	res = e.Run(ctx, stage, owner, stages.RunOptions{
		SkipApply: true,
		Wait:      time.Minute,
		FirstLook: 100 * time.Millisecond,
		Progress: func(stages.Result) error {
			calls++
			return stop
		},
	})
	if calls != 1 || res.State != capstanv1.StageInProgress {
		t.Errorf("after a Progress error: %d calls, result %s; want the attempt to end at the first report", calls, res.State)
	}
}

// TestApplyAmongManyObjectsDoesNotListThemAll: a stage's objects in a
// namespace that holds many more of their kind (a fleet of deployments in
// one namespace) are read with one short LIST page and a GET each for the
// rest, not by listing the namespace.
func TestApplyAmongManyObjectsDoesNotListThemAll(t *testing.T) {
	ns := newNamespace(t)
	ctx := testContext(t)
	c, log := newClient(t)
	e := stages.NewExecutor(c)
	applyOthers(t, e, ns, "other")
	mine := configMaps(ns, 10, "a")
	mark := log.mark()
	cs, err := e.Apply(ctx, mine, "Config", owner)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(cs.ToGroupedMap()[ssa.CreatedAction]); got != len(mine) {
		t.Errorf("created %d, want %d", got, len(mine))
	}
	got := countRequests(log.since(mark))
	if got.lists != 1 || got.gets > len(mine) || got.applies != len(mine) {
		t.Errorf("requests %+v, want one LIST page, at most a GET per object and an apply each", got)
	}
}

// applyOthers applies 200 ConfigMaps named prefix-000 ... into ns for
// another deployment: the many objects of a fleet's namespace.
func applyOthers(t *testing.T, e *stages.Executor, ns, prefix string) {
	t.Helper()
	others := make([]*unstructured.Unstructured, 200)
	for i := range others {
		others[i] = configMap(ns, fmt.Sprintf("%s-%03d", prefix, i), map[string]any{"v": "x"})
	}
	if _, err := e.Apply(testContext(t), others, "Others", stages.Owner{Name: "others", Namespace: ns}); err != nil {
		t.Fatal(err)
	}
}

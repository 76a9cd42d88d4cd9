package reconciler

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/render"
)

// notified counts the statuses handed to the reporters.
type notified struct{ n atomic.Int32 }

func (n *notified) Notify(*capstanv1.ClusterDeployment) { n.n.Add(1) }

// statusFixture is a reconciler over a fake client that counts status
// patches, with its metrics and reporters.
func statusFixture(t *testing.T, cd *capstanv1.ClusterDeployment) (*Reconciler, *atomic.Int32, *notified) {
	t.Helper()
	var patches atomic.Int32
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(cd).WithStatusSubresource(cd).
		WithInterceptorFuncs(interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			patches.Add(1)
			return c.SubResource(sub).Patch(ctx, obj, p, opts...)
		}}).Build()
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	n := &notified{}
	return &Reconciler{client: c, metrics: m, report: n}, &patches, n
}

// A status that did not change costs no API request and tells no
// reporter; one that did is written once, with the summary kubectl's
// columns read, and told.
func TestPatchStatusWritesOnlyWhatChanged(t *testing.T) {
	cd := dependent("app")
	r, patches, told := statusFixture(t, cd)
	ctx := context.Background()
	before := cd.DeepCopy()
	before.Status.Summary = before.Status.Summarize()
	if err := r.patchStatus(ctx, before, before.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if patches.Load() != 0 || told.n.Load() != 0 {
		t.Fatalf("an unchanged status made %d patches and %d notifications, want none", patches.Load(), told.n.Load())
	}
	after := before.DeepCopy()
	after.Status.Revision = "main@sha1:2"
	after.Status.Stages = []capstanv1.StageStatus{{Name: "Network", State: capstanv1.StageReady}}
	if err := r.patchStatus(ctx, before, after); err != nil {
		t.Fatal(err)
	}
	if patches.Load() != 1 || told.n.Load() != 1 {
		t.Fatalf("a changed status made %d patches and %d notifications, want one each", patches.Load(), told.n.Load())
	}
	got := &capstanv1.ClusterDeployment{}
	if err := r.client.Get(ctx, client.ObjectKeyFromObject(cd), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Revision != "main@sha1:2" || got.Status.Summary == nil || !equality.Semantic.DeepEqual(got.Status.Summary, after.Status.Summarize()) {
		t.Errorf("written status: revision %q, summary %+v; want main@sha1:2 and %+v", got.Status.Revision, got.Status.Summary, after.Status.Summarize())
	}
}

// Conditions never carry the credentials of a URL, nor grow without
// bound; a condition without a reason still has one, as the API requires.
func TestSetConditionRedactsAndBounds(t *testing.T) {
	cd := dependent("app")
	cd.Generation = 7
	setCondition(cd, capstanv1.ConditionReady, false, "", "fetch https://capstan:hunter2@git.example/infra.git: 401 "+strings.Repeat("x", 2*maxMessage))
	c := meta.FindStatusCondition(cd.Status.Conditions, capstanv1.ConditionReady)
	if c == nil {
		t.Fatal("no Ready condition")
	}
	if strings.Contains(c.Message, "hunter2") || !strings.Contains(c.Message, "https://***@git.example/infra.git") {
		t.Errorf("the credentials of the URL were not redacted: %.120s", c.Message)
	}
	if len(c.Message) != maxMessage || !strings.HasSuffix(c.Message, "...") {
		t.Errorf("message of %d bytes, want it cut to %d with an ellipsis", len(c.Message), maxMessage)
	}
	if c.Reason != "Unknown" || c.Status != metav1.ConditionFalse || c.ObservedGeneration != 7 {
		t.Errorf("condition %+v; want reason Unknown, False, observed generation 7", c)
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"clone ssh://git:s3cret@host/r.git failed":    "clone ssh://***@host/r.git failed",
		"https://user@host/x and HTTP://a:b@h/y":      "https://***@host/x and HTTP://***@h/y",
		"no URL here: user@host is an address":        "no URL here: user@host is an address",
		"oci://registry.example/capstan/infra:v1.2.0": "oci://registry.example/capstan/infra:v1.2.0",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}

// A deployment stalled on an input is left alone while the input stays
// the same; a new revision or generation, or forgetting, tries it again.
func TestStallMemo(t *testing.T) {
	var m stallMemo
	key := types.NamespacedName{Namespace: "team", Name: "app"}
	if m.stalledOn(key, "r1", 1) {
		t.Fatal("stalled on an input never remembered")
	}
	m.remember(key, "r1", 1)
	if !m.stalledOn(key, "r1", 1) {
		t.Error("the input stalled on is not remembered")
	}
	if m.stalledOn(key, "r2", 1) || m.stalledOn(key, "r1", 2) {
		t.Error("another revision or generation counts as the input stalled on")
	}
	if m.stalledOn(types.NamespacedName{Namespace: "team", Name: "other"}, "r1", 1) {
		t.Error("another deployment counts as stalled")
	}
	m.forget(key)
	if m.stalledOn(key, "r1", 1) {
		t.Error("a forgotten stall is still remembered")
	}
}

func TestFailureCounter(t *testing.T) {
	var f failureCounter
	a, b := types.NamespacedName{Name: "a"}, types.NamespacedName{Name: "b"}
	for want := 1; want <= 3; want++ {
		if got := f.inc(a); got != want {
			t.Errorf("failure %d of a counted as %d", want, got)
		}
	}
	if got := f.inc(b); got != 1 {
		t.Errorf("b's first failure counted as %d: the counts are not per deployment", got)
	}
	f.reset(a)
	if got := f.inc(a); got != 1 {
		t.Errorf("a's failure after a reset counted as %d, want 1", got)
	}
}

// A new input makes every stage Pending at it: what they said belonged
// to another revision. The objects counted stay (they were applied).
func TestRestartStages(t *testing.T) {
	cd := dependent("app")
	started := metav1.Now()
	cd.Status.CurrentStage = "Workers"
	cd.Status.Stages = []capstanv1.StageStatus{
		{Name: "Network", State: capstanv1.StageReady, Revision: "r1", StartedAt: &started, FinishedAt: &started, Objects: 3},
		{Name: "Workers", State: capstanv1.StageInProgress, Revision: "r1", StartedAt: &started, Message: "2/3 Machines", Stuck: true, Objects: 5},
	}
	restartStages(cd, "r2")
	if cd.Status.Revision != "r2" || cd.Status.CurrentStage != "" {
		t.Errorf("revision %q, current stage %q; want r2 and none", cd.Status.Revision, cd.Status.CurrentStage)
	}
	for i, want := range []capstanv1.StageStatus{
		{Name: "Network", State: capstanv1.StagePending, Revision: "r2", Objects: 3},
		{Name: "Workers", State: capstanv1.StagePending, Revision: "r2", Objects: 5},
	} {
		got := cd.Status.Stages[i]
		if got.Name != want.Name || got.State != want.State || got.Revision != want.Revision || got.Objects != want.Objects ||
			got.StartedAt != nil || got.FinishedAt != nil || got.Message != "" || got.Stuck {
			t.Errorf("stage %d after the restart = %+v, want %+v", i, got, want)
		}
	}
}

// A source that answers again clears the Stalled condition its failure
// set, and only that one: a stall of another cause stays.
func TestSourceSucceededClearsOnlyTheSourcesStall(t *testing.T) {
	for _, tc := range []struct {
		stalledBy string
		cleared   bool
	}{{"SourceTimeout", true}, {"ObjectInvalid", false}} {
		cd := dependent("app")
		r := &Reconciler{}
		setCondition(cd, capstanv1.ConditionSourceReady, false, "SourceTimeout", "revision check did not finish")
		setCondition(cd, capstanv1.ConditionStalled, true, tc.stalledBy, "stalled")
		r.failures.inc(client.ObjectKeyFromObject(cd))
		r.sourceSucceeded(cd, "main@sha1:2")
		if got := conditionTrue(cd, capstanv1.ConditionStalled); got == tc.cleared {
			t.Errorf("stalled by %s: Stalled=%v after the source answered, want %v", tc.stalledBy, got, !tc.cleared)
		}
		src := meta.FindStatusCondition(cd.Status.Conditions, capstanv1.ConditionSourceReady)
		if src == nil || src.Status != metav1.ConditionTrue || src.Message != "revision main@sha1:2" {
			t.Errorf("SourceReady after the answer = %+v, want True at the revision", src)
		}
		if n := r.failures.inc(client.ObjectKeyFromObject(cd)); n != 1 {
			t.Errorf("the failures in a row were not reset: the next counts as %d", n)
		}
	}
}

// render spells the annotation of decrypted documents itself (it imports
// only failure); stages reads it through the API package's constant.
func TestDecryptedAnnotationAgrees(t *testing.T) {
	if render.DecryptedAnnotation != capstanv1.DecryptedAnnotation {
		t.Errorf("render marks decrypted documents %q, stages looks for %q", render.DecryptedAnnotation, capstanv1.DecryptedAnnotation)
	}
}

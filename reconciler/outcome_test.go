package reconciler

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/failure"
	"github.com/capstan-dev/capstan/reconciler/metrics"
	"github.com/capstan-dev/capstan/render"
	"github.com/capstan-dev/capstan/sources"
	"github.com/capstan-dev/capstan/stages"
)

// One table for the one place errors become status: what each kind of
// failure leaves in the conditions, the metrics outcome and the requeue.
func TestSettleTurnsEachPolicyIntoStatus(t *testing.T) {
	const interval = time.Minute
	readyAt := func(rev string) *capstanv1.ClusterDeployment {
		cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns", Generation: 2}}
		cd.Spec.Interval = &metav1.Duration{Duration: interval}
		cd.Status.Revision, cd.Status.ObservedGeneration = rev, 2
		cd.Status.Stages = []capstanv1.StageStatus{{Name: "Infra", State: capstanv1.StageReady, Revision: rev}}
		setCondition(cd, capstanv1.ConditionReady, true, "Succeeded", "all 1 stages ready at "+rev)
		return cd
	}
	outage := fmt.Errorf("check source: %w", sources.Unavailable(errors.New("dial tcp: connection refused")))
	type want struct {
		ready, stalled, sourceReady metav1.ConditionStatus // "" = not set
		reason                      string
		outcome                     metrics.Outcome
		requeue                     time.Duration
		stagesAt                    string
	}
	for _, tc := range []struct {
		name   string
		source bool
		err    error
		want   want
	}{
		{"a source outage keeps Ready and polls at the interval", true, outage,
			want{"True", "", "False", sources.ReasonSourceUnavailable, metrics.OutcomeError, time.Second, "rev1"}},
		{"refused credentials stall the source, Ready stays", true, fmt.Errorf("check source: %w", sources.ErrAuth),
			want{"True", "True", "False", sources.ReasonAuthenticationFailed, metrics.OutcomeStalled, interval, "rev1"}},
		{"a render error of a new revision stalls and restarts the stages", false, &render.Error{File: "a.yaml", Err: errors.New("invalid YAML")},
			want{"False", "True", "", render.ReasonRenderFailed, metrics.OutcomeStalled, interval, "rev2"}},
		{"an apply error is retried with backoff", false, failure.Retryable(stages.ReasonApplyFailed, errors.New("timeout")),
			want{"False", "False", "", stages.ReasonApplyFailed, metrics.OutcomeError, time.Second, "rev1"}},
		{"a dependency is waited for, not failed", false, waitForDependencies(ReasonDependencyNotReady, "waiting for ns/other"),
			want{"False", "False", "", ReasonDependencyNotReady, metrics.OutcomeSuccess, dependencyRecheck, "rev1"}},
		{"a write refused because another replica took the deployment over is not a failure", false,
			fmt.Errorf("stage Apply: %w", &NotOwnerError{Namespace: "ns", Name: "edge", Owner: "replica-b"}),
			want{"False", "False", "", ReasonHandedOver, metrics.OutcomeSuccess, time.Second, "rev1"}},
		{"an error with nothing to say is retried", false, errors.New("etcdserver: leader changed"),
			want{"False", "False", "", ReasonReconcileFailed, metrics.OutcomeError, time.Second, "rev1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Reconciler{opts: DefaultReconcilerOptions()}
			a := &attempt{cd: readyAt("rev1"), revision: "rev2", sourceFailed: tc.source, outcome: metrics.OutcomeSuccess}
			f, requeue := r.settle(a, tc.err)
			if f.Reason != tc.want.reason || a.outcome != tc.want.outcome || requeue != tc.want.requeue {
				t.Errorf("reason %s, outcome %s, requeue %s; want %s, %s, %s", f.Reason, a.outcome, requeue, tc.want.reason, tc.want.outcome, tc.want.requeue)
			}
			for typ, want := range map[string]metav1.ConditionStatus{
				capstanv1.ConditionReady: tc.want.ready, capstanv1.ConditionStalled: tc.want.stalled, capstanv1.ConditionSourceReady: tc.want.sourceReady,
			} {
				c := meta.FindStatusCondition(a.cd.Status.Conditions, typ)
				switch {
				case want == "" && c != nil:
					t.Errorf("%s = %s (%s), want it unset", typ, c.Status, c.Reason)
				case want != "" && (c == nil || c.Status != want):
					t.Errorf("%s = %+v, want %s", typ, c, want)
				}
			}
			if got := a.cd.Status.Stages[0].Revision; got != tc.want.stagesAt {
				t.Errorf("stages at %s, want %s", got, tc.want.stagesAt)
			}
		})
	}
}

// Failures in a row back off; a source's backoff never passes the poll
// interval, however many there were.
func TestSourceBackoffIsCappedByTheInterval(t *testing.T) {
	r := &Reconciler{opts: ReconcilerOptions{RetryBase: time.Second, RetryMax: time.Hour}}
	cd := &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns"}}
	cd.Spec.Interval = &metav1.Duration{Duration: 10 * time.Second}
	var last time.Duration
	for range 20 {
		_, last = r.settle(&attempt{cd: cd, sourceFailed: true}, sources.Unavailable(errors.New("refused")))
	}
	if last != 10*time.Second {
		t.Errorf("after 20 source failures the next poll is in %s, want the interval 10s", last)
	}
}

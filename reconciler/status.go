package reconciler

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// maxMessage bounds a message in status, so that a long error list cannot
// push the object past etcd's size limit.
const maxMessage = 4096

// statusWriteTimeout bounds one status write.
const statusWriteTimeout = 10 * time.Second

func setCondition(cd *capstanv1.ClusterDeployment, typ string, status bool, reason, msg string) {
	s := metav1.ConditionFalse
	if status {
		s = metav1.ConditionTrue
	}
	if reason == "" {
		reason = "Unknown"
	}
	meta.SetStatusCondition(&cd.Status.Conditions, metav1.Condition{
		Type:               typ,
		Status:             s,
		Reason:             reason,
		Message:            truncate(redact(msg)),
		ObservedGeneration: cd.Generation,
	})
}

func conditionTrue(cd *capstanv1.ClusterDeployment, typ string) bool {
	return meta.IsStatusConditionTrue(cd.Status.Conditions, typ)
}

// patchStatus writes the status when it differs from before; an unchanged
// status costs no API call. The stage metrics are recorded from what was
// written. The write outlives a cancelled ctx by up to
// statusWriteTimeout, so that progress made just before a shutdown (an
// apply that finished) is recorded and not redone by the next daemon.
func (r *Reconciler) patchStatus(ctx context.Context, before, after *capstanv1.ClusterDeployment) error {
	// kubectl's columns read the summary: it follows every write.
	after.Status.Summary = after.Status.Summarize()
	if equality.Semantic.DeepEqual(before.Status, after.Status) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), statusWriteTimeout)
	defer cancel()
	if err := r.client.Status().Patch(ctx, after, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("patch status of ClusterDeployment %s/%s: %w", after.Namespace, after.Name, err)
	}
	// Metrics follow what was written, so a long walk shows each stage as
	// it moves rather than at the end of the reconcile.
	r.metrics.RecordStages(after)
	r.notifyStatus(after)
	return nil
}

// saveStatus writes what a's deployment has in status more than the API
// server last had (a.written), then takes the answer as the new base. An
// attempt writes through it only, so that a change one step makes can go
// with the next write instead of costing one of its own.
func (r *Reconciler) saveStatus(ctx context.Context, a *attempt) error {
	if err := r.patchStatus(ctx, a.written, a.cd); err != nil {
		return err
	}
	a.written = a.cd.DeepCopy()
	return nil
}

func (r *Reconciler) event(cd *capstanv1.ClusterDeployment, typ, reason, format string, args ...any) {
	r.events.Eventf(cd, nil, typ, reason, "Reconcile", "%s", truncate(redact(fmt.Sprintf(format, args...))))
}

var userinfo = regexp.MustCompile(`(?i)([a-z][a-z0-9+.-]*://)[^/@\s]+@`)

// redact removes credentials that may hide in a message, such as the
// user:password part of a URL.
func redact(s string) string {
	return userinfo.ReplaceAllString(s, "${1}***@")
}

func truncate(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	return s[:maxMessage-3] + "..."
}

// failureCounter counts consecutive failed reconciles per deployment.
type failureCounter struct {
	mu sync.Mutex
	n  map[types.NamespacedName]int
}

func (f *failureCounter) inc(key types.NamespacedName) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[types.NamespacedName]int{}
	}
	f.n[key]++
	return f.n[key]
}

func (f *failureCounter) reset(key types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.n, key)
}

// stallMemo remembers, per deployment, the input (revision and
// generation) it stalled on, so that a poll finding the same input does
// nothing. It lives in memory: after a restart a stalled deployment is
// tried once more, which is cheap and finds a fix made meanwhile outside
// the input.
type stallMemo struct {
	mu sync.Mutex
	at map[types.NamespacedName]stalledInput
}

type stalledInput struct {
	revision   string
	generation int64
}

func (m *stallMemo) remember(key types.NamespacedName, revision string, generation int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.at == nil {
		m.at = map[types.NamespacedName]stalledInput{}
	}
	m.at[key] = stalledInput{revision: revision, generation: generation}
}

func (m *stallMemo) forget(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.at, key)
}

// stalledOn reports whether the deployment stalled on this very input.
func (m *stallMemo) stalledOn(key types.NamespacedName, revision string, generation int64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	in, ok := m.at[key]
	return ok && in == stalledInput{revision: revision, generation: generation}
}

// restartStages makes every recorded stage Pending at revision: what they
// said belonged to another input.
func restartStages(cd *capstanv1.ClusterDeployment, revision string) {
	for i, st := range cd.Status.Stages {
		cd.Status.Stages[i] = capstanv1.StageStatus{Name: st.Name, State: capstanv1.StagePending, Revision: revision, Objects: st.Objects}
	}
	cd.Status.Revision = revision
	cd.Status.CurrentStage = ""
}

// sourceSucceeded records that the source answered: SourceReady=True, and
// what a source failure had set is cleared (a Stalled condition of its
// reason, the failures in a row it counted).
func (r *Reconciler) sourceSucceeded(cd *capstanv1.ClusterDeployment, revision string) {
	if prev := meta.FindStatusCondition(cd.Status.Conditions, capstanv1.ConditionSourceReady); prev != nil && prev.Status == metav1.ConditionFalse {
		if st := meta.FindStatusCondition(cd.Status.Conditions, capstanv1.ConditionStalled); st != nil && st.Reason == prev.Reason {
			setCondition(cd, capstanv1.ConditionStalled, false, ReasonSourceReady, "")
		}
		r.failures.reset(client.ObjectKeyFromObject(cd))
	}
	setCondition(cd, capstanv1.ConditionSourceReady, true, ReasonSucceeded, "revision "+revision)
}

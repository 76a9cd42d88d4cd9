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

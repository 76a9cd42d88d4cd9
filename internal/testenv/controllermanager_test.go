package testenv

import (
	"context"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// TestControllerManagerUpdatesPDBStatus shows the disruption controller of
// kube-controller-manager at work: it sets status.observedGeneration of a
// PodDisruptionBudget, which drain tests rely on.
func TestControllerManagerUpdatesPDBStatus(t *testing.T) {
	t.Logf("shared control plane with kube-controller-manager and CRDs started in %s", envStartTime)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ns, err := env.CreateNamespace(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(env.Config)
	pdbs := client.PolicyV1().PodDisruptionBudgets(ns)
	minAvailable := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: &minAvailable,
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		},
	}
	created, err := pdbs.Create(ctx, pdb, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PodDisruptionBudget: %v", err)
	}
	begin := time.Now()

	w, err := pdbs.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", "web").String(),
		ResourceVersion: created.ResourceVersion,
	})
	if err != nil {
		t.Fatalf("watch PodDisruptionBudget: %v", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			t.Fatalf("PodDisruptionBudget status.observedGeneration not set: %v", ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch of PodDisruptionBudget closed")
			}
			got, isPDB := ev.Object.(*policyv1.PodDisruptionBudget)
			if ev.Type == watch.Error || !isPDB {
				t.Fatalf("watch of PodDisruptionBudget: %v", ev.Object)
			}
			if got.Status.ObservedGeneration == got.Generation {
				t.Logf("disruption controller set observedGeneration %d after %s (desiredHealthy %d)",
					got.Status.ObservedGeneration, time.Since(begin), got.Status.DesiredHealthy)
				return
			}
		}
	}
}

package stages

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestDrainMustLeave pins which pods a drain evicts: all but DaemonSet
// pods, mirror pods and pods already finished.
func TestDrainMustLeave(t *testing.T) {
	owned := func(kind string, controller bool) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: "x", UID: "u", Controller: ptr.To(controller)}}
	}
	cases := []struct {
		name  string
		pod   corev1.Pod
		leave bool
	}{
		{"a bare pod leaves", corev1.Pod{}, true},
		{"a ReplicaSet's pod leaves", corev1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: owned("ReplicaSet", true)}}, true},
		{"a DaemonSet's pod stays", corev1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: owned("DaemonSet", true)}}, false},
		{"a pod a DaemonSet owns but does not control leaves", corev1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: owned("DaemonSet", false)}}, true},
		{"a mirror pod stays", corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{mirrorPodAnnotation: "abc"}}}, false},
		{"a finished pod holds nothing up", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}, false},
		{"a failed pod holds nothing up", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed}}, false},
		{"a running pod leaves", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := mustLeave(&tc.pod); got != tc.leave {
				t.Errorf("mustLeave = %v, want %v", got, tc.leave)
			}
		})
	}
}

func TestDrainDescribesBudget(t *testing.T) {
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0, CurrentHealthy: 3, DesiredHealthy: 3},
	}
	want := "PodDisruptionBudget shop/web (0 disruptions allowed: 3 healthy, 3 needed)"
	if got := describePDB(pdb); got != want {
		t.Errorf("describePDB = %q, want %q", got, want)
	}
}

package stages_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/stages"
)

// A readiness check that names its apiVersion reads the object in that
// version, whichever served version it was written in: the API server
// converts it. Without one the check sees the version written.
func TestWaitReadsInTheChecksVersion(t *testing.T) {
	ns := newNamespace(t)
	installGizmos(t)
	ctx := testContext(t)
	c, _ := newClient(t)
	gizmo := decodeObjects(t, `apiVersion: served.test.capstan.dev/v1beta1
kind: Gizmo
metadata: {name: old, namespace: `+ns+`}`)[0]
	// The wait follows the objects its owner applied.
	gizmo.SetLabels(map[string]string{stages.OwnerGroup + "/name": owner.Name, stages.OwnerGroup + "/namespace": owner.Namespace})
	if err := c.Patch(ctx, gizmo.DeepCopy(), client.Apply, client.FieldOwner("test"), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	check := capstanv1.ReadinessCheck{Kind: "served.test.capstan.dev/Gizmo", CEL: "object.apiVersion == 'served.test.capstan.dev/v1beta2'",
		Message: "read in v1beta2"}
	e := stages.NewExecutor(c)

	withVersion := check
	withVersion.APIVersion = "served.test.capstan.dev/v1beta2"
	checker, err := stages.NewChecker([]capstanv1.ReadinessCheck{withVersion})
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.Wait(ctx, []*unstructured.Unstructured{gizmo}, checker, owner)
	if err != nil || !v.Ready {
		t.Errorf("Wait with apiVersion v1beta2 = %+v, %v; want Ready", v, err)
	}

	checker, err = stages.NewChecker([]capstanv1.ReadinessCheck{check})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v, err = e.Wait(short, []*unstructured.Unstructured{gizmo}, checker, owner)
	if err != nil || v.Ready || !strings.Contains(v.Message, "read in v1beta2") {
		t.Errorf("Wait without apiVersion = %+v, %v; want not ready, read in the version written", v, err)
	}
}

// apiVersion needs a kind of its group, and one version per kind.
func TestReadinessCheckAPIVersionRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		checks []capstanv1.ReadinessCheck
		want   string
	}{
		{"no kind", []capstanv1.ReadinessCheck{{CEL: "true", APIVersion: "cluster.x-k8s.io/v1beta2"}}, "needs kind: cluster.x-k8s.io/<Kind>"},
		{"kind of another group", []capstanv1.ReadinessCheck{{CEL: "true", Kind: "apps/Deployment", APIVersion: "cluster.x-k8s.io/v1beta2"}}, "needs kind"},
		{"not a group/version", []capstanv1.ReadinessCheck{{CEL: "true", Kind: "x/K", APIVersion: "a/b/c"}}, "is not a group/version"},
		{"two versions of one kind", []capstanv1.ReadinessCheck{
			{CEL: "true", Kind: "cluster.x-k8s.io/Cluster", APIVersion: "cluster.x-k8s.io/v1beta2"},
			{CEL: "true", Kind: "cluster.x-k8s.io/Cluster", APIVersion: "cluster.x-k8s.io/v1beta1"}}, "reads a kind in one version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := stages.NewChecker(tc.checks); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewChecker error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

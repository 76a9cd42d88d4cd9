package pivot

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// Record merges rec's set fields into status.pivot of the
// ClusterDeployment namespace/name through c (a JSON merge patch on the
// status subresource), stamping phaseTime when rec sets a phase, and
// removes the fields named in clear that rec does not set. Run, the pivot
// stage and `capstan pivot` keep one record this way. The write outlives
// a cancelled ctx by up to 10 s: a phase done must be recorded, or a
// resumed move would take it again.
func Record(ctx context.Context, c client.Client, namespace, name string, rec *capstanv1.PivotStatus, clear ...string) error {
	if rec.Phase != "" {
		now := metav1.Now()
		rec.PhaseTime = &now
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		return err
	}
	for _, k := range clear {
		if _, set := fields[k]; !set {
			fields[k] = nil
		}
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"pivot": fields}})
	if err != nil {
		return err
	}
	cd := &unstructured.Unstructured{}
	cd.SetGroupVersionKind(capstanv1.GroupVersion.WithKind("ClusterDeployment"))
	cd.SetNamespace(namespace)
	cd.SetName(name)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := c.Status().Patch(ctx, cd, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("record the move in ClusterDeployment %s/%s status.pivot: %w", namespace, name, err)
	}
	return nil
}

// ReadDeployment reads the ClusterDeployment namespace/name through c, and
// the fields its status.pivot holds as stored (a record a move that never
// started left is replaced whole: those are the fields to clear).
func ReadDeployment(ctx context.Context, c client.Reader, namespace, name string) (*capstanv1.ClusterDeployment, []string, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(capstanv1.GroupVersion.WithKind("ClusterDeployment"))
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, u); err != nil {
		return nil, nil, fmt.Errorf("read ClusterDeployment %s/%s: %w", namespace, name, err)
	}
	cd := &capstanv1.ClusterDeployment{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cd); err != nil {
		return nil, nil, fmt.Errorf("read ClusterDeployment %s/%s: %w", namespace, name, err)
	}
	record, _, err := unstructured.NestedMap(u.Object, "status", "pivot")
	if err != nil {
		return nil, nil, fmt.Errorf("read ClusterDeployment %s/%s: status.pivot: %w", namespace, name, err)
	}
	return cd, slices.Sorted(maps.Keys(record)), nil
}

package reconciler

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
	"github.com/capstan-dev/capstan/internal/testenv"
)

// The CRD refuses a scale stage with no count or with both a count and
// committed, saying what to write, as BuildPlan does for profiles and
// files; a committed one, or replicas 0, is taken.
func TestCRDTakesOneCountPerScaleStage(t *testing.T) {
	env := controlPlane(t)
	if err := testenv.InstallCRDs(t.Context(), env.Config, "../manifests/crds/capstan.dev_clusterdeployments.yaml"); err != nil {
		t.Fatal(err)
	}
	sch := runtime.NewScheme()
	if err := capstanv1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: sch})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(t.Context(), "crd-scale")
	if err != nil {
		t.Fatal(err)
	}
	create := func(name string, scale *capstanv1.ScaleSpec) error {
		return c.Create(t.Context(), &capstanv1.ClusterDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: capstanv1.ClusterDeploymentSpec{Path: "app", Suspend: true, Stages: []capstanv1.StageSpec{
				{Name: "Apps", Select: capstanv1.Selector{Kinds: []string{"*"}}},
				{Name: "Enabled", Action: capstanv1.StageActionScale, Scale: scale, Select: capstanv1.Selector{Kinds: []string{"apps/Deployment"}}},
			}}})
	}
	for name, scale := range map[string]*capstanv1.ScaleSpec{
		"zero":      {Replicas: ptr.To[int32](0)},
		"committed": {Committed: true},
	} {
		if err := create(name, scale); err != nil {
			t.Errorf("scale %s: %v, want it taken", name, err)
		}
	}
	for name, c := range map[string]struct {
		scale *capstanv1.ScaleSpec
		want  string
	}{
		"neither": {&capstanv1.ScaleSpec{}, "needs scale.replicas"},
		"both":    {&capstanv1.ScaleSpec{Replicas: ptr.To[int32](1), Committed: true}, "leave scale.replicas out"},
	} {
		err := create(name, c.scale)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("scale %s: %v, want invalid saying %q", name, err, c.want)
		}
	}
}

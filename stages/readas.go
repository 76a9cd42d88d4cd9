package stages

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/capstan-dev/capstan/stages/preflight"
)

// checkReadVersions reports each readiness check that reads its kind in a
// version the cluster does not serve (ReadinessCheck.APIVersion): the
// wait could never read the objects, and the stage would wait forever. A
// CRD the plan applies replaces the cluster's versions of its kind. A
// kind served in no version is left to the served check of its objects.
func checkReadVersions(plan *Plan, objects []*unstructured.Unstructured, served ServedAPIs) []preflight.Problem {
	versions := map[schema.GroupKind][]ServedVersion{}
	for gk, v := range served.Kinds {
		versions[gk] = v
	}
	for _, obj := range objects {
		if gk, v, ok := crdServes(obj); ok {
			versions[gk] = v
		}
	}
	var problems []preflight.Problem
	for _, stage := range plan.Stages {
		for i, check := range stage.ReadyWhen {
			gv, err := schema.ParseGroupVersion(check.APIVersion)
			_, kind, _ := strings.Cut(check.Kind, "/")
			if check.APIVersion == "" || err != nil {
				continue // NewChecker refuses it when the plan is built
			}
			gk := schema.GroupKind{Group: gv.Group, Kind: kind}
			vs := versions[gk]
			if len(vs) == 0 || servesVersion(ServedAPIs{Kinds: versions}, gv.WithKind(kind)) {
				continue
			}
			problems = append(problems, preflight.Problem{Object: "stage " + stage.Name, Field: fmt.Sprintf("readyWhen[%d].apiVersion", i),
				Message: fmt.Sprintf("reads %s in %s, which the cluster does not serve (%s is served as %s): the stage could never read its objects; upgrade the provider or write the check for a served version",
					kind, check.APIVersion, kind, versionList(gv.Group, vs))})
		}
	}
	return problems
}

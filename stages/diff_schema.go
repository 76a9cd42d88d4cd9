package stages

import (
	"context"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// diffSchemas checks the objects no dry run can reach yet (pending: an
// earlier object of the plan creates their namespace or their kind)
// against their schemas, with the preflight's own check
// (findSchemaProblems): the cluster's OpenAPI documents, its CRDs, and
// the CRDs the plan applies before them. An object that does not fit
// turns from a create into an invalid object, with the field and the
// file, so that `capstan diff` and a pull request's plan show the
// unknown field the preflight would refuse, not a create that looks fine.
func (e *Executor) diffSchemas(ctx context.Context, plan *Plan, pending map[*unstructured.Unstructured]*ObjectDiff) error {
	if len(pending) == 0 {
		return nil
	}
	check := make(map[*unstructured.Unstructured]bool, len(pending))
	for obj := range pending {
		check[obj] = true
	}
	v, err := e.clusterValidator(ctx, check)
	if err != nil {
		return err
	}
	objects, _ := appliedWithStage(plan)
	found, err := findSchemaProblems(ctx, v, objects, check, nil)
	if err != nil {
		return err
	}
	byObject := map[*unstructured.Unstructured][]schemaFinding{}
	for _, f := range found {
		if pending[f.obj] != nil {
			byObject[f.obj] = append(byObject[f.obj], f)
		}
	}
	for obj, findings := range byObject {
		od := pending[obj]
		od.Action = DiffInvalid
		od.File = plan.Files[obj]
		if od.File == "" {
			od.File = originFile(obj)
		}
		if len(findings) == 1 {
			od.Field, od.Error = findings[0].problem.Field, findings[0].problem.Message
			continue
		}
		// Several fields: each named in the error, none alone in Field.
		parts := make([]string, len(findings))
		for i, f := range findings {
			parts[i] = f.problem.Field + ": " + f.problem.Message
		}
		od.Error = strings.Join(parts, "; ")
	}
	return nil
}

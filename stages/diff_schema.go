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
//
// Those that fit their schemas and wait only for their namespace are then
// dry-run in the deployment's own namespace (dryRunElsewhere): the API
// server's own refusal makes them invalid too.
func (e *Executor) diffSchemas(ctx context.Context, plan *Plan, owner Owner, pending map[*unstructured.Unstructured]*ObjectDiff) error {
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
	objects, stageOf := appliedWithStage(plan)
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
	fileOf := func(obj *unstructured.Unstructured) string {
		if f := plan.Files[obj]; f != "" {
			return f
		}
		return originFile(obj)
	}
	for obj, findings := range byObject {
		od := pending[obj]
		od.Action, od.File = DiffInvalid, fileOf(obj)
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

	var elsewhere []*unstructured.Unstructured
	redefined := crdKinds(objects)
	for _, obj := range objects {
		if od := pending[obj]; od != nil && od.Action == DiffCreate && od.Note == noteNamespacePending && !redefined[obj.GroupVersionKind().GroupKind()] {
			elsewhere = append(elsewhere, obj)
		}
	}
	refused, err := e.dryRunElsewhere(ctx, elsewhere, func(obj *unstructured.Unstructured) string { return stageOf[obj] }, owner, owner.Namespace)
	if err != nil {
		return err
	}
	for i, err := range refused {
		if err != nil {
			od := pending[elsewhere[i]]
			od.Action, od.File, od.Field = DiffInvalid, fileOf(elsewhere[i]), invalidField(err)
			od.Error = standInMessage(err, owner.Namespace)
		}
	}
	return nil
}

package stages

import (
	"errors"
	"fmt"

	lcmv1 "github.com/capstan-dev/capstan/api/lcm/v1alpha1"
	capstanv1 "github.com/capstan-dev/capstan/api/v1alpha1"
)

// withRolloutPolicy returns specs with the deployment's rollout policy
// written into every rollout stage that does not set its own batch size,
// so that a stage carries all it needs. specs is not changed.
func withRolloutPolicy(specs []capstanv1.StageSpec, policy *capstanv1.RolloutPolicy) []capstanv1.StageSpec {
	if policy == nil || policy.WorkerBatchSize == nil {
		return specs
	}
	out := make([]capstanv1.StageSpec, len(specs))
	for i := range specs {
		s := *specs[i].DeepCopy()
		if s.Action == capstanv1.StageActionRollout {
			if s.Rollout == nil {
				s.Rollout = &capstanv1.RolloutSpec{}
			}
			if s.Rollout.BatchSize == nil {
				batch := *policy.WorkerBatchSize
				s.Rollout.BatchSize = &batch
			}
		}
		out[i] = s
	}
	return out
}

// rolloutSettingsOf reads a rollout stage's settings and fills in the
// defaults: every machine type, the deploy phase, 50 workers at once, no
// limit. Settings the API schema would refuse are refused here too, for
// stages that come from a profile rather than the API server.
func rolloutSettingsOf(stage *Stage) (rolloutSettings, error) {
	s := rolloutSettings{phase: lcmv1.StatePhaseDeploy, batch: int(capstanv1.DefaultWorkerBatchSize)}
	r := stage.Rollout
	if r == nil {
		return s, nil
	}
	var errs []error
	switch t := lcmv1.MachineType(r.MachineType); t {
	case "", lcmv1.MachineTypeManager, lcmv1.MachineTypeWorker:
		s.machineType = t
	default:
		errs = append(errs, fmt.Errorf("rollout.machineType: %q is neither manager nor worker", r.MachineType))
	}
	switch p := lcmv1.StatePhase(r.Phase); p {
	case "":
	case lcmv1.StatePhasePrepare, lcmv1.StatePhaseDeploy:
		s.phase = p
	default:
		errs = append(errs, fmt.Errorf("rollout.phase: %q is neither prepare nor deploy", r.Phase))
	}
	if r.BatchSize != nil {
		if *r.BatchSize < 1 {
			errs = append(errs, fmt.Errorf("rollout.batchSize: %d, want at least 1", *r.BatchSize))
		}
		s.batch = int(*r.BatchSize)
	}
	if r.Limit != nil {
		if *r.Limit < 1 {
			errs = append(errs, fmt.Errorf("rollout.limit: %d, want at least 1", *r.Limit))
		}
		s.limit = int(*r.Limit)
	}
	return s, errors.Join(errs...)
}

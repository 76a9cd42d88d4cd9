package v1alpha1

// DefaultWorkerBatchSize is how many worker machines a rollout deploys or
// upgrades at the same time when neither the stage nor the deployment
// says otherwise.
const DefaultWorkerBatchSize int32 = 50

// RolloutPolicy holds deployment-wide defaults for rollout stages.
type RolloutPolicy struct {
	// WorkerBatchSize is how many worker machines may deploy or upgrade at
	// the same time. Defaults to 50.
	// +kubebuilder:validation:Minimum=1
	// +optional
	WorkerBatchSize *int32 `json:"workerBatchSize,omitempty"`
}

// RolloutSpec configures one rollout stage.
type RolloutSpec struct {
	// MachineType limits the stage to LCM machines of this type (manager
	// or worker). Empty means every machine, managers first.
	// +kubebuilder:validation:Enum=manager;worker
	// +optional
	MachineType string `json:"machineType,omitempty"`

	// Phase is the last StateItem phase the stage runs: prepare, or
	// deploy (which includes prepare). Defaults to deploy.
	// +kubebuilder:validation:Enum=prepare;deploy
	// +optional
	Phase string `json:"phase,omitempty"`

	// BatchSize overrides the deployment's workerBatchSize for this stage.
	// Managers always go one at a time.
	// +kubebuilder:validation:Minimum=1
	// +optional
	BatchSize *int32 `json:"batchSize,omitempty"`

	// Limit makes the stage Ready once this many of its machines are
	// Ready at the LCMCluster's StateItems, and keeps it from starting
	// more machines than it takes to get there: a limit of 1 on workers
	// deploys a single worker first. Unset means every machine.
	// +kubebuilder:validation:Minimum=1
	// +optional
	Limit *int32 `json:"limit,omitempty"`
}

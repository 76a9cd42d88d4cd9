package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StatePhase is when in a machine's life a StateItem runs.
// +kubebuilder:validation:Enum=prepare;deploy;reconfigure
type StatePhase string

const (
	// StatePhasePrepare items run on every machine that has not run them
	// yet, before any deploy: they fetch archives and install packages, so
	// they need no order between machines.
	StatePhasePrepare StatePhase = "prepare"
	// StatePhaseDeploy items make the machine a node of the cluster. The
	// rollout runs them on the first manager, then on the other managers one
	// by one, then on the workers in batches.
	StatePhaseDeploy StatePhase = "deploy"
	// StatePhaseReconfigure items run on machines that are already Ready
	// when the set of managers changes.
	StatePhaseReconfigure StatePhase = "reconfigure"
)

// StateItem is one unit of work the agent on a machine runs: a download, a
// package installation, a join of the cluster.
type StateItem struct {
	// Name identifies the item within its machine type; results refer to it.
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$`
	Name string `json:"name"`

	// Phase is when the item runs: prepare, deploy or reconfigure.
	Phase StatePhase `json:"phase"`

	// Runner is what executes the item on the machine, e.g. `downloader`
	// or `ansible`; the agent refuses a runner it does not have.
	// +optional
	Runner string `json:"runner,omitempty"`

	// Version of what the item installs. A new version makes the item run
	// again, which is how an upgrade reaches a machine.
	// +optional
	Version string `json:"version,omitempty"`

	// Params are handed to the runner as they are.
	// +optional
	Params map[string]string `json:"params,omitempty"`
}

// StateItemState is where one StateItem is on a machine.
// +kubebuilder:validation:Enum=Running;Succeeded;Failed
type StateItemState string

const (
	// StateItemRunning has started and not finished.
	StateItemRunning StateItemState = "Running"
	// StateItemSucceeded finished without error.
	StateItemSucceeded StateItemState = "Succeeded"
	// StateItemFailed finished with an error; the agent runs it again.
	StateItemFailed StateItemState = "Failed"
)

// StateItemResult is what the agent reports for one StateItem.
type StateItemResult struct {
	// Name of the StateItem.
	Name string `json:"name"`

	// Phase of the StateItem when it ran.
	// +optional
	Phase StatePhase `json:"phase,omitempty"`

	// Version of the StateItem that ran. A result for an older version
	// than the spec's is stale: the item has to run again.
	// +optional
	Version string `json:"version,omitempty"`

	// State of the run.
	State StateItemState `json:"state"`

	// Attempts counts the runs of this version.
	// +optional
	Attempts int32 `json:"attempts,omitempty"`

	// ExitCode of the last finished run.
	// +optional
	ExitCode *int32 `json:"exitCode,omitempty"`

	// Message is the runner's last words: an error or a summary.
	// +optional
	Message string `json:"message,omitempty"`

	// StartedAt is when the last run started.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`

	// FinishedAt is when the last run finished.
	// +optional
	FinishedAt *metav1.Time `json:"finishedAt,omitempty"`
}

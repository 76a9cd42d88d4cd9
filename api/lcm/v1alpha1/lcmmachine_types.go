package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LCMMachineKind is the kind of LCMMachine objects.
const LCMMachineKind = "LCMMachine"

// MachineType is the role of a machine in its cluster.
// +kubebuilder:validation:Enum=manager;worker
type MachineType string

const (
	// MachineTypeManager is a control-plane machine.
	MachineTypeManager MachineType = "manager"
	// MachineTypeWorker runs workloads.
	MachineTypeWorker MachineType = "worker"
)

// MachineState is where a machine is in its life, as its agent reports it.
// +kubebuilder:validation:Enum=Uninitialized;Pending;Prepare;Deploy;Ready;Upgrade;Reconfigure
type MachineState string

const (
	// MachineStateUninitialized means the machine belongs to no LCMCluster yet.
	MachineStateUninitialized MachineState = "Uninitialized"
	// MachineStatePending means the agent has reported the node's hostname and
	// address; the machine waits for its StateItems.
	MachineStatePending MachineState = "Pending"
	// MachineStatePrepare means the machine runs its prepare StateItems.
	MachineStatePrepare MachineState = "Prepare"
	// MachineStateDeploy means the machine runs its deploy StateItems and
	// becomes a node of the cluster.
	MachineStateDeploy MachineState = "Deploy"
	// MachineStateReady means every StateItem of the spec has succeeded.
	MachineStateReady MachineState = "Ready"
	// MachineStateUpgrade means a Ready machine runs the StateItems of a new
	// release.
	MachineStateUpgrade MachineState = "Upgrade"
	// MachineStateReconfigure means a Ready machine follows a change of the
	// manager set; it is Ready again when done.
	MachineStateReconfigure MachineState = "Reconfigure"
)

// LCMMachineSpec is the StateItems one machine is to run.
type LCMMachineSpec struct {
	// Type is the machine's role; it picks the StateItem list of the
	// LCMCluster's machineTypes.
	Type MachineType `json:"type"`

	// ClusterName names the LCMCluster, in the same namespace, that the
	// machine belongs to. Empty: not assigned yet, and the machine stays
	// Uninitialized.
	// +optional
	ClusterName string `json:"clusterName,omitempty"`

	// StateItems the agent runs, written by the rollout from the
	// LCMCluster when the machine's turn comes. Items already run at the
	// same version are not run again.
	// +optional
	// +listType=map
	// +listMapKey=name
	StateItems []StateItem `json:"stateItems,omitempty"`
}

// LCMMachineStatus is what the agent on the machine reports.
type LCMMachineStatus struct {
	// ObservedGeneration is the generation whose StateItems the state
	// refers to. A state reported for an older generation says nothing
	// about the current StateItems.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// State is where the machine is in its life.
	// +optional
	State MachineState `json:"state,omitempty"`

	// Hostname of the node.
	// +optional
	Hostname string `json:"hostname,omitempty"`

	// IP is the node's address in the cluster.
	// +optional
	IP string `json:"ip,omitempty"`

	// StateItemResults holds one result per StateItem the agent has run.
	// +optional
	// +listType=map
	// +listMapKey=name
	StateItemResults []StateItemResult `json:"stateItemResults,omitempty"`

	// Conditions add detail to the state, e.g. why a StateItem fails.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// LCMMachine is one machine of an LCMCluster: the StateItems it is to run
// and what its agent reports.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lcmm,categories=capstan;lcm
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterName`
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Hostname",type=string,JSONPath=`.status.hostname`
// +kubebuilder:printcolumn:name="IP",type=string,JSONPath=`.status.ip`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LCMMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   LCMMachineSpec   `json:"spec,omitempty"`
	Status LCMMachineStatus `json:"status,omitempty"`
}

// LCMMachineList is a list of LCMMachines.
//
// +kubebuilder:object:root=true
type LCMMachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LCMMachine `json:"items"`
}

// Result returns the machine's result for the StateItem named name.
func (m *LCMMachine) Result(name string) (StateItemResult, bool) {
	for _, r := range m.Status.StateItemResults {
		if r.Name == name {
			return r, true
		}
	}
	return StateItemResult{}, false
}

// PendingItems lists, in spec order, the StateItems the agent has not
// finished: no result Succeeded at the item's version.
func (m *LCMMachine) PendingItems() []StateItem {
	var pending []StateItem
	for _, item := range m.Spec.StateItems {
		if r, ok := m.Result(item.Name); !ok || r.Version != item.Version || r.State != StateItemSucceeded {
			pending = append(pending, item)
		}
	}
	return pending
}

// DeployedBefore tells from the status whether the machine has been a
// node of its cluster: it is or was Ready, or a deploy item succeeded.
func (m *LCMMachine) DeployedBefore() bool {
	switch m.Status.State {
	case MachineStateReady, MachineStateUpgrade, MachineStateReconfigure:
		return true
	}
	for _, r := range m.Status.StateItemResults {
		if r.Phase == StatePhaseDeploy && r.State == StateItemSucceeded {
			return true
		}
	}
	return false
}

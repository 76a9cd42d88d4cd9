package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LCMClusterKind is the kind of LCMCluster objects.
const LCMClusterKind = "LCMCluster"

// LCMClusterSpec is the release a cluster's machines run and the
// StateItems that install it, per machine type.
type LCMClusterSpec struct {
	// Release names what the StateItems install, e.g. `capstan-2.1.0`. A
	// new release with new StateItems is an upgrade.
	// +kubebuilder:validation:MinLength=1
	Release string `json:"release"`

	// KubernetesVersion the release deploys, e.g. `v1.35.4`; shown in
	// status and by kubectl, not acted on.
	// +optional
	KubernetesVersion string `json:"kubernetesVersion,omitempty"`

	// MachineTypes holds the StateItems of each machine type.
	MachineTypes MachineTypes `json:"machineTypes"`
}

// MachineTypes holds one StateItem list per machine type. The rollout
// copies a machine's list into its LCMMachine when its turn comes.
type MachineTypes struct {
	// Manager items run on control-plane machines.
	// +optional
	// +listType=map
	// +listMapKey=name
	Manager []StateItem `json:"manager,omitempty"`

	// Worker items run on the other machines.
	// +optional
	// +listType=map
	// +listMapKey=name
	Worker []StateItem `json:"worker,omitempty"`
}

// MachineCounts counts a cluster's machines of one type.
type MachineCounts struct {
	// Total is how many LCMMachines of the type belong to the cluster.
	// +optional
	Total int32 `json:"total,omitempty"`
	// Ready is how many of them are Ready at the current release.
	// +optional
	Ready int32 `json:"ready,omitempty"`
}

// LCMClusterStatus is what the rollout observed.
type LCMClusterStatus struct {
	// ObservedGeneration is the generation the rollout last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Release is the release every machine is Ready at; it trails
	// spec.release during an upgrade.
	// +optional
	Release string `json:"release,omitempty"`

	// Managers counts the manager machines.
	// +optional
	Managers MachineCounts `json:"managers,omitempty"`

	// Workers counts the worker machines.
	// +optional
	Workers MachineCounts `json:"workers,omitempty"`

	// Conditions are Ready, Reconciling and Stalled, as for kstatus.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// LCMCluster is the StateItems a cluster's machines run, per machine type,
// and how far the rollout of its release has come.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lcmc,categories=capstan;lcm
// +kubebuilder:printcolumn:name="Release",type=string,JSONPath=`.spec.release`
// +kubebuilder:printcolumn:name="Deployed",type=string,JSONPath=`.status.release`
// +kubebuilder:printcolumn:name="Managers",type=integer,JSONPath=`.status.managers.ready`
// +kubebuilder:printcolumn:name="Workers",type=integer,JSONPath=`.status.workers.ready`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LCMCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   LCMClusterSpec   `json:"spec,omitempty"`
	Status LCMClusterStatus `json:"status,omitempty"`
}

// LCMClusterList is a list of LCMClusters.
//
// +kubebuilder:object:root=true
type LCMClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LCMCluster `json:"items"`
}

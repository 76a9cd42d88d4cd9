// Package v1alpha1 holds the LCM API (group lcm.capstan.dev): the model of
// a cluster's machines as the LCM rollout sees them.
//
// An LCMCluster says, per machine type (manager or worker), which
// StateItems a machine of that type runs and in which phase: prepare
// (fetch what the deployment needs), deploy (join the machine to the
// cluster) and reconfigure (follow a change of the manager set). An
// LCMMachine is one machine: the rollout copies the StateItems of its type
// into its spec when its turn comes, and the agent on the machine reports
// in its status where the machine is in its life (Uninitialized, Pending,
// Prepare, Deploy, Ready, Upgrade, Reconfigure), its hostname and address,
// and the result of every StateItem it ran.
//
// A new set of StateItems in the LCMCluster is an upgrade: the rollout
// hands it to the machines in the same order as a first deployment.
//
// +kubebuilder:object:generate=true
// +groupName=lcm.capstan.dev
package v1alpha1

// Package v1alpha1 holds the ClusterDeployment API (group capstan.dev): what
// a user commits to say which overlay describes a cluster, in which stages it
// is applied and where progress is reported, and the status in which the
// reconciler records every stage's progress.
//
// +kubebuilder:object:generate=true
// +groupName=capstan.dev
package v1alpha1

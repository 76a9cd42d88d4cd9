// Package preflight checks the network settings of rendered objects before
// anything is applied.
//
// In Capstan's data flow it judges the objects render produced, for a
// `validate` stage (stages.Executor) and for `capstan validate`:
//
//	render.Build -> []*unstructured.Unstructured -> preflight.Validate -> Report
//
// The inputs are a ConfigMap labelled `capstan.dev/config: network` (the
// control-plane, workload-plane, pod and service networks, the proxies and
// the SSH keys of the cluster), Cluster API Clusters
// (spec.clusterNetwork) and Metal3 IPAM IPPools (the node addresses).
// Validate is a pure function of these objects: it reads nothing else,
// changes nothing, and never stops at the first problem. Its Report lists
// every problem, each naming the object, the field and what was expected;
// errors fail a validate stage, warnings are only reported.
// docs/validation.md describes the keys, the defaults and every check.
package preflight

// Package e2e holds Capstan's end-to-end suites. They run the daemon
// in-process against a real etcd and kube-apiserver on loopback
// (internal/testenv) and a real git server (git http-backend), and check
// what a user would see: objects in the cluster, ClusterDeployment status
// and events. Nothing imports this package.
package e2e

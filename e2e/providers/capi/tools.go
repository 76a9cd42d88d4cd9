//go:build tools

// Package capi pins the Cluster API managers that ../build.sh compiles.
package capi

import (
	_ "sigs.k8s.io/cluster-api/bootstrap/kubeadm"
	_ "sigs.k8s.io/cluster-api/controlplane/kubeadm"
	_ "sigs.k8s.io/cluster-api/core"
)

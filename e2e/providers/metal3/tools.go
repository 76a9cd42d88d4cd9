//go:build tools

// Package metal3 pins the three Metal3 managers ../build.sh compiles: the
// Cluster API Provider Metal3, the IP address manager and the Bare Metal
// Operator (each package main at its module's root).
package metal3

import (
	_ "github.com/metal3-io/baremetal-operator"
	_ "github.com/metal3-io/cluster-api-provider-metal3"
	_ "github.com/metal3-io/ip-address-manager"
)

//go:build tools

// Package ipam pins the Metal3 IPAM manager (package main at the module
// root) that ../build.sh compiles.
package ipam

import (
	_ "github.com/metal3-io/ip-address-manager"
)

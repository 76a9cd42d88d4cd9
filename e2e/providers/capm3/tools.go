//go:build tools

// Package capm3 pins the CAPM3 manager (package main at the module root)
// that ../build.sh compiles.
package capm3

import (
	_ "github.com/metal3-io/cluster-api-provider-metal3"
)

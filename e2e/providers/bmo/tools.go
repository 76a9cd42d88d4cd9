//go:build tools

// Package bmo pins the Bare Metal Operator (package main at the module
// root) that ../build.sh compiles.
package bmo

import (
	_ "github.com/metal3-io/baremetal-operator"
)

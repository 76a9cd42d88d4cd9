// Package manifests holds what installs Capstan into a cluster: its CRDs
// (generated from api/ by `make generate`), RBAC and Deployment. They are
// embedded so that the binary can install itself (capstan dev, pivot) and
// tests can load the CRDs without knowing the repository layout.
package manifests

import "embed"

// CRDs holds crds/*.yaml.
//
//go:embed crds/*.yaml
var CRDs embed.FS

// Install holds install/*.yaml: namespace, RBAC and Deployment.
//
//go:embed install/*.yaml
var Install embed.FS

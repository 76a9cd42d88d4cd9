// Module crds pins the Cluster API and Metal3 releases whose own
// CustomResourceDefinitions Capstan's tests install into the test control
// plane (internal/testenv.ProviderCRDDirs reads the versions from here and
// finds each module's CRD folders in the module cache). The versions below
// are the one place they are written; they are released together: CAPM3
// v1.13 supports Cluster API v1.14.
//
// No code imports these modules, so `go mod tidy` would drop them: do not
// tidy this module. The metal3-io modules are not in the public checksum
// database under these versions; download them with
// GONOSUMDB=github.com/metal3-io (ProviderCRDDirs does).
module github.com/capstan-dev/capstan/e2e/crds

go 1.26.0

require (
	github.com/metal3-io/baremetal-operator v0.13.2
	github.com/metal3-io/cluster-api-provider-metal3 v1.13.2
	github.com/metal3-io/ip-address-manager v1.13.2
	sigs.k8s.io/cluster-api v1.14.2
)

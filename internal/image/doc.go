// Package image builds container images of Capstan's Go programs without
// Docker: each platform's binary is cross-compiled (CGO off, so static) and
// packed with go-containerregistry into a one-layer image that runs as the
// unprivileged user 65532, carries CA certificates for https sources, and
// is labelled with where it came from. The platforms' images form one OCI
// index, written as an OCI layout tarball (which `ctr images import` and
// registries take) or pushed to a registry.
//
// `make image` builds Capstan's image through cmd/capstan-image; the
// in-cluster end-to-end suite and the test node's pause image use Build
// directly.
package image

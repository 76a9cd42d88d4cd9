// Package image builds container images of Capstan's Go programs without
// Docker or a base image: each platform's binary is cross-compiled
// (CGO_ENABLED=0, so static; -trimpath) and packed with
// go-containerregistry into a one-layer image with passwd and group naming
// the unprivileged user 65532 it runs as, CA certificates for https sources
// and registries, /tmp and a home. The platforms' images form one OCI
// index, which WriteOCITarball writes as an OCI layout tarball (what
// `ctr images import` reads) and Push sends to a registry. The tar entries'
// order and times are fixed, so a commit always gives the same digest.
//
// `make image` builds Capstan's image through cmd/capstan-image with
// CapstanOptions, and `make set-image` points manifests/kustomization.yaml
// at a released one (SetKustomizeImage). The in-cluster end-to-end suite and
// the test node's pause image call Build directly.
package image

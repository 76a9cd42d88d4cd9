#!/usr/bin/env bash
# build.sh builds the Cluster API and Metal3 controller managers that the
# tests run as processes, from the modules pinned in capi/ and metal3/ (CAPM3,
# IPAM and BMO v1.13/v0.13 are built against Cluster API v1.13 and
# controller-runtime v0.23 and share one build list, so the Kubernetes stack
# under them compiles once; CAPI v1.14 needs controller-runtime v0.24 and has
# dropped packages CAPM3 imports, so it has its own). It caches them by
# version, outside the repository:
#   ${CAPSTAN_PROVIDERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capstan/providers/<capi version>-<capm3 version>}
# A binary that is already cached at its version is not built again, so a
# second run is instant and works offline. Prints the cache directory on
# stdout when done.
set -euo pipefail
cd "$(dirname "$0")"

# The metal3-io modules are not in the public checksum database under these
# versions: each go.sum holds their hashes. No go.work or caller's -mod flag
# decides the versions.
export GOWORK=off GOFLAGS=-mod=readonly
export GONOSUMDB=${GONOSUMDB:+$GONOSUMDB,}github.com/metal3-io

version() { # module-dir module-path
  go -C "$1" list -m -f '{{.Version}}' "$2"
}
capi_version=$(version capi sigs.k8s.io/cluster-api)
capm3_version=$(version metal3 github.com/metal3-io/cluster-api-provider-metal3)
ipam_version=$(version metal3 github.com/metal3-io/ip-address-manager)
bmo_version=$(version metal3 github.com/metal3-io/baremetal-operator)
# The three Metal3 managers are cached by their release and by the build
# list they share (metal3/go.sum): another dependency version is another
# binary.
metal3_list=$(sha256sum < metal3/go.sum | cut -c1-12)

# e2e/crds/go.mod pins the versions whose CRDs the tests install: the
# controllers must be the same releases.
for pair in "sigs.k8s.io/cluster-api $capi_version" \
  "github.com/metal3-io/cluster-api-provider-metal3 $capm3_version" \
  "github.com/metal3-io/ip-address-manager $ipam_version" \
  "github.com/metal3-io/baremetal-operator $bmo_version"; do
  set -- $pair
  crds=$(awk -v m="$1" '$1 == m { print $2 }' ../crds/go.mod)
  if [ "$crds" != "$2" ]; then
    echo "providers: e2e/crds/go.mod pins $1 $crds but e2e/providers builds $2: bump both" >&2
    exit 1
  fi
done

dir=${CAPSTAN_PROVIDERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capstan/providers/$capi_version-$capm3_version}
mkdir -p "$dir"

capi_minor=${capi_version#v1.}; capi_minor=${capi_minor%%.*}
capi_ldflags="-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$capi_version -X sigs.k8s.io/cluster-api/version.gitMajor=1 -X sigs.k8s.io/cluster-api/version.gitMinor=$capi_minor -X sigs.k8s.io/cluster-api/version.gitTreeState=clean"
bmo_ldflags="-s -w -X github.com/metal3-io/baremetal-operator/pkg/version.Raw=$bmo_version"

build() { # name module-dir package version ldflags
  local name=$1 mod=$2 pkg=$3 ver=$4 ldflags=$5
  if [ -x "$dir/$name" ] && [ "$(cat "$dir/$name.version" 2>/dev/null)" = "$ver" ]; then return; fi
  echo "providers: building $name ($pkg $ver) into $dir; the first binary of each module takes minutes on 2 cores" >&2
  local start=$SECONDS
  (cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$dir/$name.tmp" "$pkg")
  mv "$dir/$name.tmp" "$dir/$name"
  echo "$ver" > "$dir/$name.version"
  echo "providers: built $name in $((SECONDS - start)) s" >&2
}

build cluster-api-manager capi sigs.k8s.io/cluster-api/core "$capi_version" "$capi_ldflags"
build kubeadm-bootstrap-manager capi sigs.k8s.io/cluster-api/bootstrap/kubeadm "$capi_version" "$capi_ldflags"
build kubeadm-control-plane-manager capi sigs.k8s.io/cluster-api/controlplane/kubeadm "$capi_version" "$capi_ldflags"
build capm3-manager metal3 github.com/metal3-io/cluster-api-provider-metal3 "$capm3_version+$metal3_list" "-s -w"
build ipam-manager metal3 github.com/metal3-io/ip-address-manager "$ipam_version+$metal3_list" "-s -w"
build baremetal-operator metal3 github.com/metal3-io/baremetal-operator "$bmo_version+$metal3_list" "$bmo_ldflags"
# workload-clusters is Capstan's own program (the fake workload clusters on
# Cluster API's in-memory API server library): its cache key is a hash of
# its source and the module's go.sum, so an edit rebuilds it.
wl_version=$(cat capi/go.sum capi/cmd/workload-clusters/*.go | sha256sum | cut -c1-16)
build workload-clusters capi ./cmd/workload-clusters "$wl_version" "-s -w"
echo "$dir"

#!/usr/bin/env bash
# build.sh builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler
# and kubelet from the
# modules pinned in go.mod and caches them by version, outside the repository:
#   ${CAPSTAN_TESTBIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capstan/testbin/<k8s version>}
# A binary that is already cached is not built again, so a second run is instant
# and works offline. Prints the cache directory on stdout when done.
set -euo pipefail
cd "$(dirname "$0")"

k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd_version=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
dir=${CAPSTAN_TESTBIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capstan/testbin/$k8s_version}
mkdir -p "$dir"

minor=${k8s_version#v1.}; minor=${minor%%.*}
kube_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"

build() { # name package ldflags
  local name=$1 pkg=$2 ldflags=$3
  if [ -x "$dir/$name" ]; then return; fi
  echo "testbin: building $name ($pkg) into $dir" >&2
  local start=$SECONDS
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$dir/$name.tmp" "$pkg"
  mv "$dir/$name.tmp" "$dir/$name"
  echo "testbin: built $name in $((SECONDS - start)) s" >&2
}

build etcd go.etcd.io/etcd/server/v3 "-s -w"

# The Kubernetes binaries (kube-scheduler and the kubelet are the opt-in
# node of internal/testenv WithNode) are built by one go build: their
# shared packages are compiled once and the four links, each of which
# keeps one core busy for a while, run side by side.
kube=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
missing=()
for name in "${kube[@]}"; do
  [ -x "$dir/$name" ] || missing+=("$name")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "testbin: building ${missing[*]} into $dir; about 15 minutes on 2 cores" >&2
  start=$SECONDS
  tmp=$(mktemp -d "$dir/build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  pkgs=()
  for name in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$name"); done
  CGO_ENABLED=0 go build -trimpath -ldflags "$kube_ldflags" -o "$tmp/" "${pkgs[@]}"
  for name in "${missing[@]}"; do mv "$tmp/$name" "$dir/$name"; done
  echo "testbin: built ${missing[*]} in $((SECONDS - start)) s" >&2
fi
echo "$etcd_version" > "$dir/etcd.version"
echo "$dir"

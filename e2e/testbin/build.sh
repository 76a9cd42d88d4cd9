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
  echo "testbin: building $name ($pkg) into $dir; kube-apiserver takes about 6 minutes on 2 cores" >&2
  local start=$SECONDS
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$dir/$name.tmp" "$pkg"
  mv "$dir/$name.tmp" "$dir/$name"
  echo "testbin: built $name in $((SECONDS - start)) s" >&2
}

build etcd go.etcd.io/etcd/server/v3 "-s -w"
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kube_ldflags"
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$kube_ldflags"
# the opt-in node (internal/testenv WithNode): a scheduler and a kubelet
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$kube_ldflags"
build kubelet k8s.io/kubernetes/cmd/kubelet "$kube_ldflags"
echo "$etcd_version" > "$dir/etcd.version"
echo "$dir"

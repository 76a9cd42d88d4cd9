#!/usr/bin/env bash
# build.sh builds the Gitea server that internal/giteaserver starts for tests
# (the real forge for pull-request comments, commit statuses and push
# webhooks), from the module pinned in go.mod, and caches it by version,
# outside the repository:
#   ${CAPSTAN_GITEA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capstan/gitea/<version>}/gitea
# Gitea is built without its `bindata` tag (that needs generated files its
# module does not ship), so it reads its templates and options from disk: the
# script copies them from the module next to the binary. SQLite needs cgo.
# A cached binary is not built again, so a second run is instant and works
# offline. Prints the cache directory on stdout when done.
set -euo pipefail
cd "$(dirname "$0")"

# No go.work or caller's -mod flag decides the versions.
export GOWORK=off GOFLAGS=-mod=readonly

# Read from go.mod, not `go list`, so that a cached binary is found without
# the module cache or the network.
version=$(awk '$1 == "require" && $2 == "code.gitea.io/gitea" { print $3 }' go.mod)
if [ -z "$version" ]; then
  echo "gitea: e2e/gitea/go.mod has no single-line require of code.gitea.io/gitea" >&2
  exit 1
fi
dir=${CAPSTAN_GITEA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capstan/gitea/$version}
mkdir -p "$dir"

if [ -x "$dir/gitea" ] && [ "$(cat "$dir/gitea.version" 2>/dev/null)" = "$version" ]; then
  echo "$dir"
  exit 0
fi

tags="sqlite sqlite_unlock_notify"
echo "gitea: building code.gitea.io/gitea $version into $dir; takes several minutes on 2 cores" >&2
start=$SECONDS
src=$(go list -m -f '{{.Dir}}' code.gitea.io/gitea)
if [ -z "$src" ]; then
  go mod download code.gitea.io/gitea
  src=$(go list -m -f '{{.Dir}}' code.gitea.io/gitea)
fi
rm -rf "$dir/options" "$dir/templates"
cp -R "$src/options" "$src/templates" "$dir/"
chmod -R u+w "$dir/options" "$dir/templates"
CGO_ENABLED=1 go build -trimpath -tags "$tags" \
  -ldflags "-s -w -X main.Version=${version#v} -X 'main.Tags=$tags'" \
  -o "$dir/gitea.tmp" code.gitea.io/gitea
mv "$dir/gitea.tmp" "$dir/gitea"
echo "$version" > "$dir/gitea.version"
echo "gitea: built gitea in $((SECONDS - start)) s" >&2
echo "$dir"

# Capstan's build, test and benchmark entry points. `make test` is what CI
# runs; on a fresh machine it first builds the control-plane binaries the
# tests start (about 15 minutes on 2 cores, cached afterwards).

GO          ?= go
TESTBIN_DIR := $(shell sh -c 'echo $${CAPSTAN_TESTBIN_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/capstan/testbin/v1.35.4}')
BIN         := bin/capstan
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
CONTROLLER_GEN_VERSION := v0.23.0

export CAPSTAN_TESTBIN_DIR := $(TESTBIN_DIR)

.PHONY: all build dev test unit e2e bench bench-sources testbin generate fmt vet tools clean

all: build

build: ## Build bin/capstan
	$(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/capstan

dev: tools ## The demo: a local control plane, examples/ in a local git repository, the provider simulator and the reconciler; shows the mgmt cluster's stages until Ready
	$(GO) run ./cmd/capstan dev $(DEV_FLAGS)

tools: ## Install the Debian packages the tests use (git, gnupg and openssh-client for signed commits, prometheus for promtool and the alert e2e)
	@command -v git >/dev/null || (apt-get update && apt-get install -y --no-install-recommends git)
	@(command -v gpg && command -v ssh-keygen) >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gnupg openssh-client)
	@(command -v promtool && command -v prometheus) >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus)

testbin: ## Build etcd, kube-apiserver and kube-controller-manager into the cache
	e2e/testbin/build.sh >/dev/null

test: tools testbin vet ## Everything CI runs: vet, unit, integration and e2e tests, fuzz corpora
	$(GO) test -count=1 -timeout 40m ./...

unit: ## Tests that need no control plane
	$(GO) test -count=1 ./api/... ./render/... ./sources/... ./cmd/...

e2e: tools testbin
	$(GO) test -count=1 -timeout 30m -v ./e2e/

bench: tools testbin ## Benchmarks; figures go to docs/benchmarks.md
	$(GO) test -run '^$$' -bench . -benchtime 3x ./stages/ ./e2e/

bench-sources: ## Source benchmarks: requests per unchanged poll, push-to-revision latency (docs/benchmarks.md)
	$(GO) test -run '^$$' -bench RevisionUnchanged ./sources/oci/ ./sources/git/
	$(GO) test -run '^$$' -bench PushToRevision -benchtime 10x ./sources/oci/ ./sources/webhook/

vet:
	$(GO) vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

generate: ## Regenerate deepcopy code and CRDs from api/
	$(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION) \
		object paths=./api/... crd:maxDescLen=400 output:crd:dir=./manifests/crds

.PHONY: crds
crds: ## Download the Cluster API and Metal3 modules whose CRDs the tests install (versions in e2e/crds/go.mod), so later test runs work offline
	cd e2e/crds && GONOSUMDB=github.com/metal3-io GOFLAGS=-mod=mod GOWORK=off $(GO) mod download -x

clean:
	rm -rf bin

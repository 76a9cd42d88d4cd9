# Capstan's build, test and benchmark entry points. `make test` is what CI
# runs; on a fresh machine it first builds the control-plane binaries the
# tests start (about 15 minutes on 2 cores, cached afterwards).

GO          ?= go
TESTBIN_DIR := $(shell sh -c 'echo $${CAPSTAN_TESTBIN_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/capstan/testbin/v1.35.4}')
BIN         := bin/capstan
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
CONTROLLER_GEN_VERSION := v0.23.0

export CAPSTAN_TESTBIN_DIR := $(TESTBIN_DIR)

# The image `make image` builds. It is pushed when PUSH=1, or when IMAGE_REPO
# or IMAGE is given on the command line or in the environment (a registry
# you named is one you mean to push to); the defaults only write
# bin/capstan-image.tar. The image's labels carry IMAGE_SOURCE and the
# commit; its creation time is the commit's, so a commit gives one digest.
IMAGE_REPO      ?= ghcr.io/capstan-dev/capstan
IMAGE_TAG       ?= $(VERSION)
IMAGE           ?= $(IMAGE_REPO):$(IMAGE_TAG)
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
IMAGE_SOURCE    ?= https://github.com/capstan-dev/capstan
IMAGE_PUSH      := $(if $(or $(filter 1,$(PUSH)),$(filter command line environment,$(origin IMAGE_REPO) $(origin IMAGE))),--push)

.PHONY: all build dev test unit e2e bench bench-sources testbin providers gitea generate fmt vet tools clean image set-image e2e-kind

all: build

build: ## Build bin/capstan
	$(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/capstan

image: ## Build Capstan's image without Docker (static, nonroot 65532, linux/amd64 + linux/arm64) into bin/capstan-image.tar (`ctr -n k8s.io images import --all-platforms` reads it); PUSH=1 or IMAGE_REPO=host:port/capstan also pushes it. Leaves the tree clean: see set-image
	$(GO) run ./internal/image/cmd/capstan-image build --ref $(IMAGE) --version $(VERSION) \
		--revision $$(git rev-parse HEAD) --source $(IMAGE_SOURCE) --platforms $(IMAGE_PLATFORMS) \
		--go $(GO) --out bin/capstan-image.tar $(IMAGE_PUSH)

# set-image is separate from image on purpose: building an image must not
# edit a tracked file, while pointing the manifests at an image is a release
# step that is committed.
set-image: ## Point manifests/kustomization.yaml (what `kubectl apply -k manifests/` and `capstan install` use) at IMAGE (REPO:TAG or REPO@DIGEST); a release step, so `make image` leaves the tree clean
	$(GO) run ./internal/image/cmd/capstan-image set-image --kustomization manifests/kustomization.yaml \
		--name capstan --ref $(IMAGE)

# dev installs nothing: it needs Go and git (for the repository it serves;
# DEV_FLAGS=--dir=examples reads the files in place without git). The
# first run builds the control plane into the cache, as `make testbin` does.
dev: build ## The demo: a local control plane, examples/ in a local git repository, the provider simulator and the reconciler; shows the mgmt cluster's stages until Ready, then follows pushes until Ctrl-C (docs/dev.md)
	$(BIN) dev $(DEV_FLAGS)

tools: ## Install the Debian packages the tests use (git, gnupg and openssh-client for signed commits, prometheus for promtool and the alert e2e, containerd and runc for the test node)
	@command -v git >/dev/null || (apt-get update && apt-get install -y --no-install-recommends git)
	@(command -v gpg && command -v ssh-keygen) >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gnupg openssh-client)
	@(command -v promtool && command -v prometheus) >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus)
	@(command -v containerd && command -v containerd-shim-runc-v2 && command -v runc) >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends containerd)

providers: ## Build the Cluster API, CAPM3, IPAM and BareMetal Operator managers the metal3 suite runs (e2e/providers; ~12 min the first time, cached in ~/.cache/capstan/providers)
	e2e/providers/build.sh >/dev/null

gitea: ## Build the Gitea server the forge tests run (internal/giteaserver; e2e/gitea, ~5 min the first time, cached in ~/.cache/capstan/gitea)
	e2e/gitea/build.sh >/dev/null

testbin: ## Build etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubelet into the cache
	e2e/testbin/build.sh >/dev/null

# Tests, vet and the binaries and images the tests build (go build of
# ./cmd/capstan, image.Build) all compile with the flags of Capstan's
# image: static (CGO_ENABLED=0) and -trimpath. One set of flags means one
# compile of the dependency tree in the build cache; with Go's defaults
# (cgo on, no -trimpath) beside the image's, a fresh machine compiled it
# twice (docs/benchmarks.md, "A fresh make test").
TEST_ENV := GOFLAGS=-trimpath CGO_ENABLED=0

# The binaries the tests run, and vet, are built side by side: each build
# spends a good part of its time in the linker, which keeps one core busy,
# so one at a time left the other core of a 2-core CI machine idle.
test: tools ## Everything CI runs: vet, unit, integration and e2e tests, fuzz corpora
	$(MAKE) --no-print-directory -j4 testbin providers gitea vet
	$(TEST_ENV) $(GO) test -count=1 -timeout 40m ./...

unit: ## Tests that need no control plane
	$(TEST_ENV) $(GO) test -count=1 ./api/... ./render/... ./sources/... ./cmd/...

e2e: tools testbin providers gitea
	$(TEST_ENV) $(GO) test -count=1 -timeout 30m -v ./e2e/ ./e2e/incluster/ ./e2e/metal3/

e2e-kind: ## The in-cluster suite on a kind cluster (Docker that runs privileged containers, and the kind node image); its precondition check says what is missing
	CAPSTAN_E2E_BACKEND=kind $(GO) test -count=1 -timeout 60m -v ./e2e/incluster/

bench: tools testbin ## Benchmarks; figures go to docs/benchmarks.md
	$(GO) test -run '^$$' -bench . -benchtime 3x ./render/ ./stages/ ./e2e/ ./e2e/incluster/
	$(GO) test -run '^$$' -bench ThousandDeployments -benchtime 1x -timeout 60m ./e2e/scale/

bench-sources: ## Source benchmarks: requests per unchanged poll, push-to-revision latency (docs/benchmarks.md)
	$(GO) test -run '^$$' -bench RevisionUnchanged ./sources/oci/ ./sources/git/
	$(GO) test -run '^$$' -bench PushToRevision -benchtime 10x ./sources/oci/ ./sources/webhook/

vet:
	$(TEST_ENV) $(GO) vet ./...

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

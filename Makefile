# walcount's build. `make test` is what CI runs (see .ci/run).

GO ?= go
BIN = bin/walcount

.PHONY: all build install image test-image release-snapshot test-release deps deps-demo deps-bench test test-matrix pg lint demo bench soak clean

all: build

# build stamps the commit and the modified flag from git (walcount
# --version, walcount_build_info) when git can read the checkout: Go's own
# VCS stamping does it in a plain clone, but not in a git worktree (.git is
# a file there) nor with -buildvcs=false in GOFLAGS or `go env -w`. The
# version is left to Go (a pseudo-version in a clone, else dev).
BUILDINFO = github.com/walcount/walcount/internal/buildinfo
build:
	$(GO) build -ldflags "$(if $(GIT_REVISION),-X $(BUILDINFO).revision=$(GIT_REVISION) -X $(BUILDINFO).modified=$(GIT_MODIFIED))" -o $(BIN) ./cmd/walcount

# install builds walcount and copies it to $(PREFIX)/bin when PREFIX is
# given (make install PREFIX=/usr/local), else to $(GOBIN) when it is set,
# else to the first GOPATH's bin ($(HOME)/go/bin by default): where
# `go install` puts it too.
PREFIX ?=
GOBIN ?= $(shell $(GO) env GOBIN)
INSTALL_DIR = $(if $(PREFIX),$(PREFIX)/bin,$(if $(GOBIN),$(GOBIN),$(firstword $(subst :, ,$(shell $(GO) env GOPATH)))/bin))
install: build
	mkdir -p "$(INSTALL_DIR)"
	cp $(BIN) "$(INSTALL_DIR)/walcount"
	@echo "installed $(INSTALL_DIR)/walcount"
	@case ":$$PATH:" in *":$(INSTALL_DIR):"*) ;; *) echo "note: $(INSTALL_DIR) is not in PATH; add it, e.g. export PATH=\"$(INSTALL_DIR):\$$PATH\"" ;; esac

# image builds the container image walcount:$(IMAGE_TAG) with the version,
# commit and modified flag of this checkout stamped in (the build context
# has no .git). It needs a Docker engine and BuildKit (DOCKER_BUILDKIT=1:
# the default builder since Docker 23, built into the client of Debian's
# docker.io 20.10). BASE selects the Dockerfile's base:
#   distroless  (default) walcount built in the pinned golang image, on the
#               pinned distroless static nonroot: both are pulled.
#   local       pulls nothing: the static binary is built here with the
#               Dockerfile's flags into bin/image/walcount, and the root
#               filesystem (nonroot user, CA certificates, /tmp) is
#               assembled from this machine into bin/image/
#               (scripts/image-rootfs.sh). For a machine without a registry.
# DOCKER names the docker client.
GIT_VERSION = $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
GIT_REVISION = $(shell git rev-parse HEAD 2>/dev/null)
GIT_MODIFIED = $(shell if [ -z "$(GIT_REVISION)" ]; then echo; elif [ -z "$$(git status --porcelain 2>/dev/null)" ]; then echo false; else echo true; fi)
IMAGE_TAG ?= $(GIT_VERSION)
BASE ?= distroless
DOCKER ?= docker
IMAGE_LDFLAGS = -s -w -X $(BUILDINFO).version=$(GIT_VERSION) -X $(BUILDINFO).revision=$(GIT_REVISION) -X $(BUILDINFO).modified=$(GIT_MODIFIED)
image:
	@case "$(BASE)" in distroless | local) ;; *) echo "make image: BASE=$(BASE): use distroless (the default) or local" >&2; exit 2 ;; esac
	@if [ "$(BASE)" = local ]; then \
		set -x; \
		CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags "$(IMAGE_LDFLAGS)" -o bin/image/walcount ./cmd/walcount && \
		sh scripts/image-rootfs.sh bin/image; \
	fi
	DOCKER_BUILDKIT=1 $(DOCKER) build --build-arg BASE=$(BASE) --build-arg VERSION=$(GIT_VERSION) \
		--build-arg REVISION=$(GIT_REVISION) --build-arg MODIFIED=$(GIT_MODIFIED) -t walcount:$(IMAGE_TAG) .

# test-image builds the image with BASE=local and runs it, and
# docker-compose.yml's walcount services, on throwaway servers of this host
# (deploy/image_test.go, TestImage): it needs a Docker engine (DOCKER_HOST)
# with BuildKit and Debian's docker-compose. CI runs it once, on a dockerd
# that scripts/docker-engine.sh starts.
test-image:
	DOCKER=$(DOCKER) WALCOUNT_TEST_IMAGE=1 $(GO) test -count=1 -timeout 15m -v -run 'TestImage$$' ./deploy

# release-snapshot builds what a release ships into dist/, from this
# checkout, publishing nothing: static linux and darwin binaries (amd64,
# arm64) in tar.gz archives, .deb and .rpm packages with the systemd unit,
# checksums.txt. goreleaser (pinned in scripts/go-tool.sh) is built once
# into the tools cache. goreleaser reads the commit only in a repository
# with a remote (without one it stamps "none" as the revision), so a
# checkout without one is refused.
release-snapshot:
	@git ls-remote --get-url >/dev/null 2>&1 || { echo "make release-snapshot: this repository has no git remote, and goreleaser then stamps the revision \"none\"; add one (git remote add origin <url>), or run it in a clone, whose remote is this repository" >&2; exit 1; }
	goreleaser=$$(sh scripts/go-tool.sh goreleaser) && "$$goreleaser" release --snapshot --clean

# test-release runs goreleaser on a clone of HEAD for linux/amd64 and checks
# the archive, the packages and the packaged binary (deploy/release_test.go,
# build tag release). CI runs it once, after make test.
test-release:
	$(GO) test -tags release -count=1 -timeout 30m -run TestReleaseSnapshot ./deploy

# deps installs (as root) or names what the tests need: PostgreSQL >= 14
# server binaries, redis-server and promtool. deps-demo and deps-bench
# need no promtool.
deps:
	sh scripts/ensure-deps.sh test

deps-demo:
	sh scripts/ensure-deps.sh demo

deps-bench:
	sh scripts/ensure-deps.sh bench

# test builds the pinned helm into the tools cache first (once per machine;
# scripts/go-tool.sh), so that the chart's tests do not build it while the
# other tests run.
test: deps
	@sh scripts/go-tool.sh helm >/dev/null
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 40m ./...
	@[ -n "$$WALCOUNT_TEST_IMAGE" ] || echo "make test: the container image test (TestImage in ./deploy) was not run: it needs a Docker engine; make test-image runs it"

# pg fetches the PostgreSQL server binaries of the given major versions
# (14 to 18) into the cache internal/testkit/servers reads with WALCOUNT_TEST_PG, e.g.
# make pg PG="14 17". It needs npm and node (installed with apt-get as root).
PG ?=
pg:
	@if [ -z "$(PG)" ]; then echo 'make pg: say which versions, e.g. make pg PG="14 17"' >&2; exit 2; fi
	sh scripts/fetch-postgres.sh $(PG)

# test-matrix runs the end-to-end core packages once per PostgreSQL major
# version (WALCOUNT_TEST_PG=<v>), after fetching the versions not installed
# locally, and prints a table of the results. Narrow it with MATRIX_VERSIONS,
# MATRIX_PKGS and MATRIX_ARGS (extra go test flags), e.g.
# make test-matrix MATRIX_VERSIONS="14 17" MATRIX_ARGS="-run TestFailover".
MATRIX_VERSIONS ?= 14 15 16 17 18
MATRIX_PKGS ?= ./app/daemon ./cmd/walcount ./app/setup ./app/preflight ./slot ./reconcile ./sink ./cdc ./internal/testkit/servers
MATRIX_ARGS ?=
test-matrix: deps
	MATRIX_VERSIONS="$(MATRIX_VERSIONS)" MATRIX_PKGS="$(MATRIX_PKGS)" MATRIX_ARGS="$(MATRIX_ARGS)" GO="$(GO)" \
		bash scripts/test-matrix.sh

lint:
	@files=$$(gofmt -l .); \
	if [ -n "$$files" ]; then echo "gofmt -l found unformatted files:"; echo "$$files"; exit 1; fi
	$(GO) vet ./...

# demo runs walcount against throwaway servers under load and verifies every
# count; pass flags with DEMO_FLAGS, e.g. make demo DEMO_FLAGS="--duration 1m".
demo: deps-demo build
	$(GO) run ./cmd/demo ./$(BIN) demo $(DEMO_FLAGS)

# bench measures walcount against the alternatives on this machine (30 to 40
# minutes on 2 CPUs) and writes bench/results/; QUICK=1 makes it a short run (-quick,
# a few minutes). Pass more flags with BENCH_FLAGS (go run ./bench -h).
bench: deps-bench build
	@quick=; if [ -n "$(QUICK)" ] && [ "$(QUICK)" != 0 ]; then quick=-quick; fi; \
	echo "$(GO) run ./bench $$quick $(BENCH_FLAGS)"; \
	$(GO) run ./bench $$quick $(BENCH_FLAGS)

# soak runs mixed churn over every counter kind with a fault every few
# minutes for SOAK_DURATION (default 1h; CI does not run it), sampling
# walcount's and the servers' resources into bench/results/soak-*.csv and
# checking every counter exact at each quiet point (docs/benchmarks.md, The
# soak). More flags with SOAK_FLAGS (go run ./bench -h, -soak-*).
SOAK_DURATION ?= 1h
soak: deps-bench build
	@echo "$(GO) run ./bench -soak $(SOAK_DURATION) $(SOAK_FLAGS)"; \
	$(GO) run ./bench -soak $(SOAK_DURATION) $(SOAK_FLAGS)

clean:
	rm -rf bin

# mqlet build, test and demo. Everything that needs root-level set-up (containerd, registry, test
# images) is done by scripts/testenv.sh, which both `make demo` and `make test` call.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)

# The semantic version from the nearest vX.Y.Z tag (scripts/version.sh says what it prints between
# tags and without any); `make VERSION=v1.2.3` overrides it.
ifeq ($(origin VERSION),undefined)
VERSION := $(shell bash scripts/version.sh)
endif
ifeq ($(VERSION),)
$(error scripts/version.sh printed no version (see its error above); set VERSION=vX.Y.Z to build anyway)
endif
COMMIT  ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.stampedVersion=$(VERSION) -X main.stampedCommit=$(COMMIT)
GOBUILD := CGO_ENABLED=0 go build -trimpath -tags grpcnotrace -ldflags "$(LDFLAGS)"
TESTENV := /run/mqlet-test/env

.PHONY: version build cross release test unit fuzz demo demo-down bench bench-fleet testenv testenv-down vet clean

# Prints the version `make build` stamps.
version:
	@echo $(VERSION)

build:
	$(GOBUILD) -o bin/mqlet ./cmd/mqlet
	$(GOBUILD) -o bin/mqlet-bridge ./cmd/mqlet-bridge
	$(GOBUILD) -o bin/mqlet-fleetsim ./cmd/mqlet-fleetsim

cross:
	GOOS=linux GOARCH=amd64 $(GOBUILD) -o bin/mqlet-linux-amd64 ./cmd/mqlet
	GOOS=linux GOARCH=arm64 $(GOBUILD) -o bin/mqlet-linux-arm64 ./cmd/mqlet
	GOOS=linux GOARCH=arm GOARM=7 $(GOBUILD) -o bin/mqlet-linux-armv7 ./cmd/mqlet
	@ls -l bin/mqlet-linux-*

# Release artifacts in dist/ (docs/operations.md): per architecture a static tarball and a .deb
# (tools/release, nfpm, a module of its own so nfpm stays out of mqlet's dependencies), the
# mqlet-bridge image as a docker-archive `ctr images import` takes (tools/mkimage -file) for amd64
# and arm64 with configs/bridge/deployment.yaml naming it, and SHA256SUMS.
BRIDGE_TAG = $(subst +,-,$(VERSION))
release:
	rm -rf dist bin/release
	mkdir -p dist bin/release
	GOOS=linux GOARCH=amd64 $(GOBUILD) -o bin/release/mqlet-linux-amd64 ./cmd/mqlet
	GOOS=linux GOARCH=arm64 $(GOBUILD) -o bin/release/mqlet-linux-arm64 ./cmd/mqlet
	GOOS=linux GOARCH=arm GOARM=7 $(GOBUILD) -o bin/release/mqlet-linux-armv7 ./cmd/mqlet
	for a in amd64 arm64; do \
	  GOOS=linux GOARCH=$$a $(GOBUILD) -o bin/release/mqlet-bridge-linux-$$a ./cmd/mqlet-bridge && \
	  go run ./tools/mkimage -file bin/release/mqlet-bridge-linux-$$a=/usr/local/bin/mqlet-bridge -arch $$a \
	    -ref localhost/mqlet-bridge:$(BRIDGE_TAG) -o dist/mqlet-bridge-$(VERSION:v%=%)-linux-$$a.image.tar || exit 1; \
	done
	cd tools/release && go run . -version $(VERSION) -repo ../.. -bin ../../bin/release -out ../../dist
	@ls -l dist

testenv:
	bash scripts/testenv.sh

testenv-down:
	bash scripts/testenv-down.sh

# All tests, against the real containerd and registry that testenv starts. MQLET_TEST_REQUIRE makes
# a missing environment a failure instead of a skip. The conformance lane's CI subset runs after
# the Go tests (conformance-ci; called directly so testenv does not run twice).
test: testenv
	set -a && . $(TESTENV) && set +a && MQLET_TEST_REQUIRE=1 go test -count=1 -timeout 20m ./...
	cd tools/release && go test -count=1 ./...
	go test -tags conformance -count=1 -skip '^TestConformance$$' ./tools/conformance/
	bash scripts/conformance.sh -ci
	$(MAKE) fuzz
	$(MAKE) test-vm test-arm

# The MQTT payload and topic decoders, and the link's inbound packet framing, under the fuzzer,
# each for a bounded number of executions (CI runs this as part of `make test`; raise FUZZTIME for
# a longer hunt). A count, not a duration: Go 1.26's fuzz coordinator can report "context deadline
# exceeded" when a duration budget ends while a worker is busy (go.dev/issue/75804, fixed in Go
# 1.27), which failed CI once with no crasher.
FUZZTIME ?= 100000x
FUZZ_TARGETS := FuzzParseTopic FuzzDecodeDesired FuzzDecodeIndex FuzzDecodeLogsRequest
fuzz:
	for f in $(FUZZ_TARGETS); do go test -run=NONE -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) ./sync/protocol/ || exit 1; done
	go test -run=NONE -fuzz='^FuzzFrameGuard$$' -fuzztime=$(FUZZTIME) ./sync/link/
	go test -run=NONE -fuzz='^FuzzAttested$$' -fuzztime=$(FUZZTIME) ./sync/sealing/

# The cgroup v2 lane (docs/testing.md): a cached Debian 12 guest under qemu (TCG where KVM does not
# really run) with systemd and cgroup v2 only; agent/cgroup's real-v2 tests and a pod started by the
# shipped unit. Never touches the host's services.
.PHONY: test-vm test-arm test-vm-arm64
test-vm:
	bash scripts/vm/run.sh

# One pod on a full arm64 Debian 12 guest (qemu-system-aarch64 TCG, systemd, cgroup v2, Debian's
# containerd): scripts/vm/arm64.sh. Not part of `make test` (docs/testing.md says why: its cost).
test-vm-arm64:
	bash scripts/vm/arm64.sh

# The arm64 and armv7 release binaries (make cross) under Debian's qemu-user-static.
test-arm:
	bash scripts/vm/arm.sh

# Pure-logic tests only; no containerd needed.
unit:
	go test -count=1 -short ./...

demo: build
	bash scripts/testenv.sh --no-kube
	bash scripts/demo.sh

demo-down:
	bash scripts/demo.sh down

bench:
	bash scripts/testenv.sh --no-kube
	bash scripts/bench.sh

# mqlet-bridge with 1,000 simulated nodes and 10,000 pods on a real control plane (BENCHMARKS.md).
bench-fleet: testenv
	bash scripts/bench-fleet.sh

# Kubernetes' sig-node conformance specs against mqlet-bridge and one mqlet node (docs/testing.md,
# "The conformance lane"); writes docs/conformance.md. Long (a clean e2e.test build is ~30 min on a
# loaded 2-core machine, cached after); not part of `make test` or CI (its subset conformance-ci
# is). CONFORMANCE_FLAGS takes scripts/conformance.sh's flags, e.g.
# CONFORMANCE_FLAGS='-keep /tmp/conf-logs'.
.PHONY: conformance conformance-ci
conformance: testenv
	bash scripts/conformance.sh $(CONFORMANCE_FLAGS)

# The lane's CI subset (part of `make test`): the specs tools/conformance/ci-specs.txt lists, on a
# smaller suite binary (scripts/conformance-bins.sh --ci, cached like e2e.test); fails unless every
# one passes; writes no report (docs/testing.md, "The CI subset").
conformance-ci: testenv
	bash scripts/conformance.sh -ci

vet:
	go vet ./...
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

clean:
	rm -rf bin dist

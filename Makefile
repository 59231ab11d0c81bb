# mig-agent — a node-local NVIDIA MIG geometry manager.
# Targets: build test check bench demo package release release-test. All offline once modules and
# the test API server binaries are cached (~/.cache).

GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS   := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# go-nvml is cgo (it dlopens libnvidia-ml.so.1 at run time and binds its
# symbols lazily, so the binary starts on machines with no driver): a plain
# `go build` needs nothing more. -s -w drop the symbol table and DWARF.
export CGO_ENABLED := 1
# Fuzz budgets are execution counts, not durations: a duration sets a
# deadline that Go's fuzz coordinator can see expire before it stops its
# workers, which fails a green run under load ("context deadline
# exceeded"); a count sets none.
FUZZ_GEOMETRY ?= 30000x
FUZZ_PROFILES ?= 250000x
STATICCHECK ?= v0.8.2

.PHONY: all build simlib test unit fuzz check bench fleet-bench demo package release push release-test clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/mig-agent ./cmd/mig-agent

# The simulator as NVIDIA's NVML library, for NVIDIA's own binaries and
# mig-agent's --nvml real path (docs/testing.md, "NVIDIA's stack on
# simulated MIG GPUs"): bin/libnvidia-ml.so.1 answers over the state file
# MIG_AGENT_SIM_STATE names; bin/sim-node runs a command in a mount
# namespace that looks like a GPU node for that state.
simlib:
	$(GO) build -buildmode=c-shared -trimpath -ldflags '-s -w -extldflags -Wl,-soname,libnvidia-ml.so.1' \
		-o bin/libnvidia-ml.so.1 ./nvmlx/simlib
	rm -f bin/libnvidia-ml.so.h
	$(GO) build -trimpath -ldflags '-s -w' -o bin/sim-node ./nvmlx/simnode

# Every test (packages one at a time: -p 1 keeps the scenario tests, which
# run real servers and the GPU Operator, from competing for 2 cores): units, fuzz targets briefly, and the integration and scenario
# tests on a real kube-apiserver + etcd (built once, cached in ~/.cache), a
# real dbus-daemon, the GPU Operator's own controller and NVIDIA's device
# plugin and GPU Feature Discovery (built once from their Go modules, cached
# in ~/.cache/gpu-operator-test and ~/.cache/nvidia-device-plugin-test). The
# Kubernetes binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet) and etcd are built up front, so that no test's
# timeout pays for their first build. The real kubelet (testkit/realnode)
# runs over Debian's containerd and runc.
test: build
	bash hack/ensure-dbus.sh
	bash hack/ensure-containerd.sh
	bash hack/kube-apiserver.sh build --with-controller-manager --with-scheduler --with-kubelet >/dev/null
	bash hack/gpu-operator.sh build
	bash hack/nvidia-device-plugin.sh build >/dev/null
	$(GO) test -count=1 -p 1 -timeout 40m ./...
	$(MAKE) fuzz
	cd packaging/monitoring && $(GO) test -count=1 ./...
	cd packaging/test && $(GO) test -count=1 ./...

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZ_GEOMETRY) -fuzzminimizetime 100x ./geometry
	$(GO) test -run '^$$' -fuzz '^FuzzParseName$$' -fuzztime $(FUZZ_PROFILES) -fuzzminimizetime 100x ./profiles

check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK) ./...
	cd packaging/monitoring && $(GO) vet ./...
	cd packaging/test && $(GO) vet ./...
	cd hack/fleetplot && $(GO) vet ./...
	cd packaging/release && $(GO) vet ./...

bench: build
	$(GO) test -run '^$$' -bench . -benchmem ./geometry ./profiles
	$(GO) run ./hack/bench
	$(GO) run ./hack/assignbench
	$(GO) run ./hack/plannerbench
	@echo "planner: the CPU of one round at 1,500 pending pods and 20 opted-in nodes (ns/op):"
	$(GO) test -run '^$$' -bench 'Decide1500' -benchmem ./planner
	@echo "fleet figures (K agents on one API server, --max-concurrent N): make fleet-bench (docs/fleet.md)"

# The fleet bench: FLEET_K simulated nodes (each a real mig-agent process on
# sim:h200x8) on one real kube-apiserver, a pool-wide label change, for each
# --max-concurrent in FLEET_N. Fails when a node never converges or more than
# N nodes are disrupted at once. Merged into bench-results.json ("fleet");
# the plot is drawn by hack/fleetplot, a module of its own.
FLEET_K ?= 10,20
FLEET_N ?= 1,10,50
FLEET_BENCH_ARGS ?=
fleet-bench: build
	$(GO) run ./hack/bench -fleet -fleet-k $(FLEET_K) -fleet-n $(FLEET_N) $(FLEET_BENCH_ARGS)
	cd hack/fleetplot && $(GO) run . -i ../../bench-results.json -o ../../docs/fleet-bench.png

demo: build
	bash hack/demo.sh

package: build
	bash packaging/build-packages.sh

# Every artifact of a release into dist/ (docs/release.md): per linux/amd64
# and linux/arm64 the binary archive (glibc >= 2.28), .deb, .rpm and SPDX
# SBOM; the OCI image index of both as an OCI-layout tar; the chart .tgz;
# SHA256SUMS. Needs VERSION=x.y.z.
release:
	@test -n "$(filter command line environment,$(origin VERSION))" || { echo "make release needs VERSION=x.y.z"; exit 2; }
	bash packaging/release/release.sh $(VERSION)

# Pushes the release in dist/ (make release VERSION=x.y.z first): the image
# index as $(REGISTRY)/mig-agent:$(VERSION), both platforms, and the chart
# as oci://$(REGISTRY)/charts/mig-agent version $(VERSION) (docs/release.md).
# Credentials from the Docker config (docker login, crane auth login); plain
# HTTP only for a loopback registry.
push:
	@test -n "$(REGISTRY)" -a -n "$(filter command line environment,$(origin VERSION))" || { echo "make push needs REGISTRY=host:port VERSION=x.y.z"; exit 2; }
	cd packaging/release && $(GO) run . push -dist $(CURDIR)/dist -registry $(REGISTRY) -version $(VERSION)

# Builds a release and runs each artifact (packaging/test TestRelease*):
# the arm64 binary under qemu, each image's root file system by its own
# entrypoint, the chart from its .tgz alone, the packages' metadata, the
# glibc floor.
RELEASE_TEST_VERSION ?= 0.9.0
release-test:
	cd packaging/release && $(GO) test -count=1 ./...
	bash packaging/release/release.sh $(RELEASE_TEST_VERSION)
	bash packaging/release/ensure-test-tools.sh
	cd packaging/test && MIG_AGENT_DIST=$(CURDIR)/dist MIG_AGENT_RELEASE_VERSION=$(RELEASE_TEST_VERSION) \
		$(GO) test -count=1 -run '^TestRelease' -v .
	cd packaging/release && MIG_AGENT_DIST=$(CURDIR)/dist MIG_AGENT_RELEASE_VERSION=$(RELEASE_TEST_VERSION) \
		$(GO) test -count=1 -run '^TestPushRelease$$' -v .

clean:
	rm -rf bin dist bench-results.json

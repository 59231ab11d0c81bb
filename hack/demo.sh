#!/usr/bin/env bash
# make demo: the agent reconciling a node label against a real local API
# server, on simulated GPUs. Needs only Go and the module proxy (first run).
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS=-Wno-deprecated-declarations CGO_LDFLAGS=-Wl,-z,lazy
[ -x bin/mig-agent ] || make build
exec go run ./hack/demo -bin bin/mig-agent

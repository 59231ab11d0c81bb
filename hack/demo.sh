#!/usr/bin/env bash
# make demo: the agent reconciling a node label against a real local API
# server, on simulated GPUs. Needs only Go and the module proxy (first run).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x bin/mig-agent ] || make build
exec go run ./hack/demo -bin bin/mig-agent

#!/usr/bin/env bash
# Read-only check of mig-agent's real NVML backend on a machine with a real
# NVIDIA GPU (an H200 for nvmlx/testdata/h200-real-profiles.json). The
# realgpu test also reads the simulated GPU of the same model through the
# same nvml.Interface calls and reports every field where it differs from
# the hardware (raw[].simDiffs in the capture, errors in realgpu-test.txt).
#
# It ONLY READS: it never changes the MIG mode, never creates or destroys GPU
# or compute instances, never resets the GPU, never changes a setting. The
# card may be shared.
#
# Build here (same linux/amd64; the driver's library is loaded at run time):
#   CGO_ENABLED=1 go test -c -tags realgpu -o bin/nvmlx-realgpu.test ./nvmlx
#   CGO_ENABLED=1 go build -o bin/mig-agent ./cmd/mig-agent
# then run on the GPU machine from the repository root:
#   hack/h200-readonly-check.sh OUTDIR
# Without bin/nvmlx-realgpu.test it falls back to `go test` where Go exists.
# Writes at most 7 files to OUTDIR (default $OUT, else ./h200-readonly-out).
set -u
out=${1:-${OUT:-./h200-readonly-out}}
mkdir -p "$out"
out=$(cd "$out" && pwd)

{
	echo "== uname"; uname -srm
	echo "== go"; command -v go >/dev/null && go version || echo "no go on this machine"
	echo "== libnvidia-ml"; ldconfig -p 2>/dev/null | grep libnvidia-ml || echo "not in the ldconfig cache"
	echo "== nvidia-smi"
	nvidia-smi --query-gpu=index,name,pci.bus_id,pci.device_id,memory.total,mig.mode.current,mig.mode.pending,driver_version --format=csv 2>&1
	echo "== nvidia-smi mig -lgip"; nvidia-smi mig -lgip 2>&1
	echo "== nvidia-smi mig -lgipp"; nvidia-smi mig -lgipp 2>&1
	echo "== nvidia-smi mig -lgi"; nvidia-smi mig -lgi 2>&1
	echo "== sysfs reset files"
	for d in /sys/bus/pci/devices/*; do
		[ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
		echo "$d class=$(cat "$d/class") reset=$([ -e "$d/reset" ] && echo yes || echo no) reset_method=$(cat "$d/reset_method" 2>/dev/null)"
	done
} >"$out/env.txt" 2>&1

# The backend through its read-only hardware test.
if [ -x bin/nvmlx-realgpu.test ]; then
	(cd nvmlx && REAL_CAPTURE_OUT="$out/h200-real-profiles.json" ../bin/nvmlx-realgpu.test \
		-test.run '^TestRealGPUReadOnly$' -test.v -test.count=1) >"$out/realgpu-test.txt" 2>&1
elif command -v go >/dev/null; then
	REAL_CAPTURE_OUT="$(realpath "$out")/h200-real-profiles.json" \
		go test -tags realgpu -run '^TestRealGPUReadOnly$' -v -count=1 ./nvmlx >"$out/realgpu-test.txt" 2>&1
else
	echo "no bin/nvmlx-realgpu.test and no go" >"$out/realgpu-test.txt"
fi
echo "realgpu test rc=$?" >>"$out/realgpu-test.txt"

# The CLI, read-only commands only.
if [ -x bin/mig-agent ]; then
	{
		echo "== mig-agent version"; bin/mig-agent version; echo "rc=$?"
		echo "== mig-agent profiles --nvml real -o json"
		bin/mig-agent profiles --nvml real -o json >"$out/profiles.json"; echo "rc=$?"
		echo "== mig-agent export --nvml real"
		bin/mig-agent export --nvml real >"$out/export.yaml"; echo "rc=$?"
		configs="$out/generated-configs.yaml"
		python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["configs"], end="")' \
			"$out/profiles.json" >"$configs" 2>&1
		for c in all-balanced all-disabled all-1g.18gb all-3g.71gb; do
			echo "== mig-agent validate --nvml real -f generated-configs.yaml -c $c"
			bin/mig-agent validate --nvml real -f "$configs" -c "$c"; echo "rc=$?"
		done
		echo "== mig-agent validate --nvml real -f export.yaml"
		bin/mig-agent validate --nvml real -f "$out/export.yaml"; echo "rc=$?"
	} >"$out/cli.txt" 2>&1
else
	echo "no bin/mig-agent" >"$out/cli.txt"
fi
ls -l "$out"

#!/usr/bin/env bash
# ensure-test-tools.sh - the Debian packages `make release-test` runs the
# artifacts with, installed when missing: qemu-user-static (the arm64
# binary and image), rpm (reading the .rpm back), llvm (llvm-objdump reads
# both architectures' symbol versions), dpkg-deb.
set -euo pipefail
missing=()
command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
command -v rpm >/dev/null || missing+=(rpm)
command -v llvm-objdump >/dev/null || missing+=(llvm)
command -v dpkg-deb >/dev/null || missing+=(dpkg)
((${#missing[@]})) || exit 0
echo "ensure-test-tools: installing ${missing[*]} (the host's architecture)" >&2
# quiet CMD...: run CMD, showing its output only when it fails.
quiet() {
	local out
	if ! out=$("$@" 2>&1); then
		printf '%s\n' "$out" >&2
		echo "ensure-test-tools: $* failed (its output is above)" >&2
		return 1
	fi
}
quiet apt-get update -q
DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -q "${missing[@]}"

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
echo "ensure-test-tools: installing ${missing[*]}" >&2
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null

#!/usr/bin/env bash
# zigcc.sh - the C compiler of the release builds: `zig cc` for the target
# ZIGCC_TARGET (x86_64-linux-gnu.2.28, aarch64-linux-gnu.2.28), so that cgo
# links against glibc 2.28's symbol versions whatever the build host's
# glibc is, and cross-compiles arm64 without a cross gcc.
#
# Environment: ZIG (the zig binary), ZIGCC_TARGET; ZIG_GLOBAL_CACHE_DIR is
# zig's own cache (its glibc stubs and crt files, built once per target).
#
# One rewrite: go-nvml binds NVML lazily (it dlopens libnvidia-ml.so.1 at
# run time), and links with -Wl,--unresolved-symbols=ignore-in-object-files
# so the nvml* symbols stay undefined with no DT_NEEDED on the driver's
# library. zig cc refuses that flag. Instead the link gets a stub shared
# library defining the nvml* symbols the objects reference, under the real
# library's soname, and the DT_NEEDED entry it adds is removed afterwards
# (patchelf --remove-needed): the binary ends as GNU ld makes it, the
# symbols undefined and bound on first call after go-nvml's dlopen.
set -euo pipefail

: "${ZIG:?ZIG must name the zig binary}" "${ZIGCC_TARGET:?ZIGCC_TARGET must name the zig target}"

args=() objs=() out="" lazy=0 prev=""
for a in "$@"; do
	case $a in
	-Wl,--unresolved-symbols=ignore-in-object-files) lazy=1 ;;
	*)
		args+=("$a")
		[[ $prev == -o ]] && out=$a
		[[ $a == *.o ]] && objs+=("$a")
		;;
	esac
	prev=$a
done

if ((lazy == 0)); then
	exec "$ZIG" cc -target "$ZIGCC_TARGET" -Wno-deprecated-declarations "${args[@]}"
fi

[[ -n $out ]] || { echo "zigcc.sh: a lazy link with no -o" >&2; exit 1; }
nm=llvm-nm
command -v "$nm" >/dev/null || nm=nm
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$nm" -u "${objs[@]}" 2>/dev/null | awk '$1 == "U" && $2 ~ /^nvml/ { print $2 }' | sort -u >"$tmp/syms"
awk '{ printf "void %s(void) {}\n", $1 }' "$tmp/syms" >"$tmp/stub.c"
"$ZIG" cc -target "$ZIGCC_TARGET" -shared -Wl,-soname,libnvidia-ml.so.1 -o "$tmp/libnvidia-ml.so.1" "$tmp/stub.c"
"$ZIG" cc -target "$ZIGCC_TARGET" "${args[@]}" -Wl,-z,lazy "$tmp/libnvidia-ml.so.1"
patchelf --remove-needed libnvidia-ml.so.1 "$out"

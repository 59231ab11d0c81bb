#!/usr/bin/env bash
# rootfs.sh DEST DEB... - the image's runtime file system besides the agent:
# the C library from Debian's libc6 package (its shared objects and the
# dynamic loader under /lib and /lib64; no locales, gconv modules or
# documentation), and the few files a glibc program reads at start or on a
# name lookup (/etc/passwd and /etc/group with root, /etc/nsswitch.conf),
# plus /tmp. One recipe for both image builds: packaging/Dockerfile's glibc
# stage runs it on the libc6 it downloads, and `make release`
# (packaging/release) runs it on the libc6 of each platform.
set -euo pipefail
dest=$1
shift
(($#)) || { echo "usage: rootfs.sh DEST DEB..." >&2; exit 2; }
x=$(mktemp -d)
trap 'rm -rf "$x"' EXIT
for deb in "$@"; do dpkg-deb -x "$deb" "$x"; done
rm -rf "$dest"
mkdir -p "$dest/etc" "$dest/tmp"
chmod 1777 "$dest/tmp"
for d in lib lib64 usr/lib; do
	[[ -d $x/$d ]] || continue
	# Shared objects and the loader only; symlinks kept as links.
	(cd "$x" && find "$d" -maxdepth 2 \( -name '*.so' -o -name '*.so.*' \) \( -type f -o -type l \) -print0) |
		tar -C "$x" --null -T - -cf - | tar -C "$dest" -xpf -
done
printf 'root:x:0:0:root:/root:/sbin/nologin\n' >"$dest/etc/passwd"
printf 'root:x:0:\n' >"$dest/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$dest/etc/nsswitch.conf"

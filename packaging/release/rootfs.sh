#!/usr/bin/env bash
# rootfs.sh DEST DEB... - the image's runtime file system besides the agent:
# from Debian's libc6 package, only the C libraries the agent loads (the
# dynamic loader; libc, libm, libpthread, libdl, librt and libresolv: what
# the binary names as NEEDED, and what the driver's libnvidia-ml.so.1, which
# the NVIDIA container toolkit injects, names), with the package's dpkg
# status entry under /var/lib/dpkg/status.d/ (as distroless images carry
# theirs, where Trivy, Grype and Syft look) and its copyright notice under
# /usr/share/doc/PACKAGE/; and the few files a glibc program reads at start
# or on a name lookup (/etc/passwd and /etc/group with root,
# /etc/nsswitch.conf), plus /tmp. No locales, gconv modules, tools or
# spare libraries (libmemusage, libpcprofile, libSegFault, ...). One recipe
# for both image builds: packaging/Dockerfile's glibc stage runs it on the
# libc6 it downloads, and `make release` (packaging/release) runs it on the
# libc6 of each platform.
set -euo pipefail
dest=$1
shift
(($#)) || { echo "usage: rootfs.sh DEST DEB..." >&2; exit 2; }
# The shared objects kept, by name (a symlink of that name is kept as a link).
keep=(-name 'ld-linux-*.so.[12]' -o -name libc.so.6 -o -name libm.so.6 -o -name libpthread.so.0
	-o -name libdl.so.2 -o -name librt.so.1 -o -name libresolv.so.2)
x=$(mktemp -d)
trap 'rm -rf "$x"' EXIT
rm -rf "$dest"
mkdir -p "$dest/etc" "$dest/tmp" "$dest/var/lib/dpkg/status.d"
chmod 1777 "$dest/tmp"
for deb in "$@"; do
	pkg=$(dpkg-deb -f "$deb" Package)
	mkdir -p "$x/$pkg"
	dpkg-deb -x "$deb" "$x/$pkg"
	# The control file as dpkg's status database holds it: installed.
	dpkg-deb -f "$deb" | awk 'NR == 1 { print; print "Status: install ok installed"; next } { print }' \
		>"$dest/var/lib/dpkg/status.d/$pkg"
	if [[ -f $x/$pkg/usr/share/doc/$pkg/copyright ]]; then
		install -D -m 0644 "$x/$pkg/usr/share/doc/$pkg/copyright" "$dest/usr/share/doc/$pkg/copyright"
	fi
	for d in lib lib64 usr/lib; do
		[[ -d $x/$pkg/$d ]] || continue
		(cd "$x/$pkg" && find "$d" -maxdepth 2 \( "${keep[@]}" \) \( -type f -o -type l \) -print0) |
			tar -C "$x/$pkg" --null -T - -cf - | tar -C "$dest" -xpf -
	done
done
printf 'root:x:0:0:root:/root:/sbin/nologin\n' >"$dest/etc/passwd"
printf 'root:x:0:\n' >"$dest/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$dest/etc/nsswitch.conf"

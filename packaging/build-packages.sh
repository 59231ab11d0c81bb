#!/usr/bin/env bash
# build-packages.sh - build the mig-agent .deb and .rpm with nfpm (`make package`).
#
# Usage: packaging/build-packages.sh [FORMAT...]     FORMAT: deb, rpm (default both)
#
# Packs the binary that `make build` made (bin/mig-agent), the systemd unit,
# the example settings and MIG config, and the maintainer scripts, as
# packaging/nfpm/nfpm.yaml says, into dist/. The package version is the one
# the binary reports (`mig-agent version`, from `git describe`), made
# sortable for dpkg and rpm:
#   v1.2.3 -> 1.2.3   v1.2.3-rc.1 -> 1.2.3~rc.1   v1.2.3-4-gabc1234 -> 1.2.3+git4.gabc1234
#   abc1234 (no tag yet) -> 0.0.0+git.abc1234      a -dirty tree adds .dirty
#
# nfpm is kept out of the agent's module graph: it is built once with
# `go install github.com/goreleaser/nfpm/v2/cmd/nfpm@$NFPM_VERSION` (a
# command-line module install, which ignores this repository's go.mod) into
# $MIG_AGENT_TOOLS_DIR and reused, so later runs need no network.
#
# Environment (all optional; relative paths are relative to the repository root):
#   MIG_AGENT_BIN        the binary to pack (default bin/mig-agent)
#   DIST                 output directory (default dist)
#   NFPM                 an nfpm binary to use instead of building one
#   NFPM_VERSION         default v2.45.2
#   MIG_AGENT_TOOLS_DIR  default ${XDG_CACHE_HOME:-$HOME/.cache}/mig-agent-tools
#   MIG_AGENT_ARCH       Go architecture name of the binary (default: read from its ELF header)
#   MIG_AGENT_VERSION_RAW  the version to package (default: what `$MIG_AGENT_BIN version`
#                        prints; set it for a binary of another architecture)
set -euo pipefail

NFPM_VERSION=${NFPM_VERSION:-v2.45.2}
TOOLS_DIR=${MIG_AGENT_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mig-agent-tools}

log() { printf 'build-packages: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

# pkg_version RAW: the `mig-agent version` string as a dpkg/rpm version.
pkg_version() {
	local raw=${1#v} base pre="" post="" dirty=""
	if [[ $raw == *-dirty ]]; then dirty=.dirty raw=${raw%-dirty}; fi
	if [[ $raw =~ ^([0-9]+\.[0-9]+\.[0-9]+)(-(.+))?-([0-9]+)-g([0-9a-f]+)$ ]]; then
		base=${BASH_REMATCH[1]} pre=${BASH_REMATCH[3]} post=git${BASH_REMATCH[4]}.g${BASH_REMATCH[5]}
	elif [[ $raw =~ ^([0-9]+\.[0-9]+\.[0-9]+)(-(.+))?$ ]]; then
		base=${BASH_REMATCH[1]} pre=${BASH_REMATCH[3]}
	elif [[ $raw =~ ^[0-9a-zA-Z.]+$ ]]; then
		base=0.0.0 post=git.$raw
		[[ $raw == dev ]] && post=dev
	else
		die "cannot make a package version of '$1'"
	fi
	[[ -n $dirty && -z $post ]] && post=dirty dirty=""
	local v=$base
	[[ -n $pre ]] && v+="~${pre//-/.}"
	[[ -n $post ]] && v+="+$post$dirty"
	printf '%s\n' "$v"
}

# elf_arch FILE: the Go architecture of an ELF executable (e_machine).
elf_arch() {
	local m
	m=$(od -An -tu2 -j18 -N2 "$1" | tr -d ' ')
	case $m in
	62) echo amd64 ;;
	183) echo arm64 ;;
	21) echo ppc64le ;;
	22) echo s390x ;;
	*) die "$1: unknown ELF machine $m (set MIG_AGENT_ARCH)" ;;
	esac
}

# glibc_needed FILE: the newest GLIBC_x.y symbol version FILE links to
# (2.34 when objdump is missing: what Go 1.26 cgo builds need on glibc >= 2.34).
glibc_needed() {
	local v=""
	# llvm-objdump reads every architecture; binutils' objdump only the host's.
	local od
	for od in llvm-objdump objdump; do
		command -v $od >/dev/null || continue
		v=$($od -T "$1" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -1)
		[[ -n $v ]] && break
	done
	echo "${v:-2.34}"
}

ensure_nfpm() {
	if [[ -n ${NFPM:-} ]]; then
		[[ -x $NFPM ]] || die "NFPM=$NFPM is not executable"
		echo "$NFPM"
		return
	fi
	local dir=$TOOLS_DIR/nfpm-$NFPM_VERSION
	if [[ ! -x $dir/nfpm ]]; then
		command -v go >/dev/null || die "go is not installed (needed once to build nfpm $NFPM_VERSION)"
		log "building nfpm $NFPM_VERSION into $dir (once)"
		mkdir -p "$dir"
		# From a scratch directory, so no go.mod or go.work above is consulted.
		# Offline, `go install mod@version` still asks the proxy whether the
		# module is deprecated: the second try serves the module cache
		# (already checksum-verified when it was filled) as the proxy.
		local scratch
		scratch=$(mktemp -d)
		(cd "$scratch" && GOWORK=off GOFLAGS=-mod=mod GOBIN=$dir CGO_ENABLED=0 \
			go install "github.com/goreleaser/nfpm/v2/cmd/nfpm@$NFPM_VERSION") ||
			(log "retrying from the module cache only" &&
				cd "$scratch" && GOWORK=off GOFLAGS=-mod=mod GOBIN=$dir CGO_ENABLED=0 GOSUMDB=off \
				GOPROXY="file://$(go env GOMODCACHE)/cache/download" \
				go install "github.com/goreleaser/nfpm/v2/cmd/nfpm@$NFPM_VERSION") ||
			die "building nfpm $NFPM_VERSION failed (it needs the Go module proxy once)"
		rm -rf "$scratch"
	fi
	echo "$dir/nfpm"
}

main() {
	local formats=("$@") bin dist nfpm raw f p tmp
	((${#formats[@]})) || formats=(deb rpm)
	for f in "${formats[@]}"; do
		[[ $f == deb || $f == rpm ]] || die "unknown package format '$f' (deb, rpm)"
	done
	bin=$(readlink -f "${MIG_AGENT_BIN:-bin/mig-agent}")
	[[ -x $bin ]] || die "no executable ${MIG_AGENT_BIN:-bin/mig-agent}: run 'make build' first"
	for f in packaging/systemd/mig-agent.service packaging/settings.yaml packaging/examples/config.yaml docs/install.md docs/install-systemd.md; do
		[[ -f $f ]] || die "missing $f"
	done
	dist=${DIST:-dist}
	mkdir -p "$dist"
	dist=$(readlink -f "$dist")

	raw=${MIG_AGENT_VERSION_RAW:-$("$bin" version | awk 'NR == 1 { print $2 }')}
	[[ -n $raw ]] || die "$bin version printed no version"
	export MIG_AGENT_BIN=$bin
	MIG_AGENT_VERSION=$(pkg_version "$raw")
	MIG_AGENT_ARCH=${MIG_AGENT_ARCH:-$(elf_arch "$bin")}
	MIG_AGENT_GLIBC=$(glibc_needed "$bin")
	export MIG_AGENT_VERSION MIG_AGENT_ARCH MIG_AGENT_GLIBC
	nfpm=$(ensure_nfpm)
	log "mig-agent $raw -> package version $MIG_AGENT_VERSION ($MIG_AGENT_ARCH, glibc >= $MIG_AGENT_GLIBC)"
	for f in "${formats[@]}"; do
		# Each into a fresh directory first, so its name (nfpm's conventional
		# one) is known; the path goes to stdout.
		tmp=$(mktemp -d "$dist/.nfpm-$f.XXXXXX")
		"$nfpm" package --config packaging/nfpm/nfpm.yaml --packager "$f" --target "$tmp/" >&2 ||
			{ rm -rf "$tmp"; die "nfpm $f failed"; }
		for p in "$tmp"/*; do
			mv -f "$p" "$dist/"
			echo "$dist/${p##*/}"
		done
		rmdir "$tmp"
	done
}

main "$@"

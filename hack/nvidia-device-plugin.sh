#!/usr/bin/env bash
# nvidia-device-plugin.sh - NVIDIA's own k8s-device-plugin and GPU Feature
# Discovery, unmodified, for the real-node tests (they run over the
# simulator built as libnvidia-ml.so.1: make simlib, docs/testing.md).
#
# Built from NVIDIA's published Go module github.com/NVIDIA/k8s-device-plugin
# through the Go module proxy, once, and cached. The device plugin and its
# config-manager are v0.17.4, the version the GPU Operator v25.3.4 deploys
# (deployments/gpu-operator/values.yaml devicePlugin.version); GPU Feature
# Discovery is v0.18.2, the oldest release whose dependencies the proxy
# serves (v0.17.4 needs sigs.k8s.io/node-feature-discovery v0.15.7, which it
# refuses).
#
# Usage:
#   nvidia-device-plugin.sh build
#         Build (or reuse) the cached binaries; prints the cache's bin dir:
#         nvidia-device-plugin, config-manager, gpu-feature-discovery.
#   nvidia-device-plugin.sh dir
#         Print the bin dir if it is complete (exit 1 otherwise; builds nothing).
#
# Environment (all optional):
#   NVIDIA_DP_TEST_CACHE_DIR  cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/nvidia-device-plugin-test)
#   GOMODCACHE / GOCACHE / GOPROXY / GOTOOLCHAIN are used as the go command sees them.
set -euo pipefail

MODULE=github.com/NVIDIA/k8s-device-plugin
PLUGIN_VERSION=v0.17.4
GFD_VERSION=v0.18.2
CACHE_ROOT=${NVIDIA_DP_TEST_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nvidia-device-plugin-test}
# Bump when the build recipe below changes, so the cache is rebuilt.
BUILD_REV=1
DIR=$CACHE_ROOT/plugin-$PLUGIN_VERSION-gfd-$GFD_VERSION-r$BUILD_REV

log() { printf 'nvidia-device-plugin-test: %s\n' "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

complete() {
	[[ -x $DIR/bin/nvidia-device-plugin && -x $DIR/bin/config-manager && -x $DIR/bin/gpu-feature-discovery ]]
}

# install VERSION CMD...: go install each command of the module at VERSION
# into the cache (cgo: the plugin and GFD load libnvidia-ml.so.1 at run time).
install() {
	local version=$1 cmd
	shift
	for cmd in "$@"; do
		GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=1 GOBIN="$DIR/bin.tmp" \
			go install -trimpath -ldflags "-s -w -X $MODULE/internal/info.version=$version" \
			"$MODULE/cmd/$cmd@$version" 2> >(grep -v -e 'deprecated' -e 'declared here' -e '^ *[0-9]* |' -e '^ *|' \
				-e 'cgo-gcc-prolog' -e 'In file included' -e '^# github.com/NVIDIA' >&2) ||
			die "building $cmd $version failed"
	done
}

build() {
	complete && return 0
	command -v go >/dev/null || die "go is not installed"
	mkdir -p "$CACHE_ROOT"
	exec 9>"$CACHE_ROOT/.build.lock"
	flock -w 3600 9 || die "timed out waiting for the build lock"
	complete && return 0
	local t0=$SECONDS
	log "building NVIDIA's device plugin $PLUGIN_VERSION and GPU Feature Discovery $GFD_VERSION (first time only: about 3 minutes on 2 cores)"
	rm -rf "$DIR/bin.tmp"
	mkdir -p "$DIR/bin.tmp"
	# go install pkg@version builds outside any main module, with the
	# plugin's own go.mod (no replace directives) deciding every version.
	(cd "$CACHE_ROOT" && install "$PLUGIN_VERSION" nvidia-device-plugin config-manager)
	(cd "$CACHE_ROOT" && install "$GFD_VERSION" gpu-feature-discovery)
	rm -rf "$DIR/bin"
	mv "$DIR/bin.tmp" "$DIR/bin"
	printf 'module %s\nnvidia-device-plugin %s\nconfig-manager %s\ngpu-feature-discovery %s\n' \
		"$MODULE" "$PLUGIN_VERSION" "$PLUGIN_VERSION" "$GFD_VERSION" >"$DIR/VERSION"
	log "built $DIR/bin in $((SECONDS - t0))s"
	exec 9>&-
}

case ${1:-} in
build)
	build
	echo "$DIR/bin"
	;;
dir)
	complete || exit 1
	echo "$DIR/bin"
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac

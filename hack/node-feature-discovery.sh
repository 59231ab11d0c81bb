#!/usr/bin/env bash
# node-feature-discovery.sh - Node Feature Discovery's worker and master,
# unmodified, for the real-node tests: the path by which GPU Feature
# Discovery's labels reach a Node on a GPU Operator cluster (GFD writes a
# feature file, nfd-worker publishes it as a NodeFeature object, nfd-master
# labels the Node).
#
# Built from the published Go module sigs.k8s.io/node-feature-discovery
# through the Go module proxy, once, and cached with the project's CRDs
# (NodeFeature, NodeFeatureGroup, NodeFeatureRule) beside the binaries.
# v0.17.3 is the version the GPU Operator v25.3.4 deploys (its chart's
# node-feature-discovery subchart). The module's go.mod replaces its api/nfd
# package with a directory the module zip does not hold (a nested module),
# and replace directives rule out `go install pkg@version`: the build runs
# in a copy of the module with that nested module, at the same version, put
# where the replace directive looks.
#
# Usage:
#   node-feature-discovery.sh build
#         Build (or reuse) the cache; prints its dir: DIR/bin/nfd-worker,
#         DIR/bin/nfd-master, DIR/nfd-api-crds.yaml.
#   node-feature-discovery.sh dir
#         Print the dir if it is complete (exit 1 otherwise; builds nothing).
#
# Environment (all optional):
#   NFD_TEST_CACHE_DIR  cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/node-feature-discovery-test)
#   GOMODCACHE / GOCACHE / GOPROXY / GOTOOLCHAIN are used as the go command sees them.
set -euo pipefail

MODULE=sigs.k8s.io/node-feature-discovery
VERSION=v0.17.3
CACHE_ROOT=${NFD_TEST_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/node-feature-discovery-test}
# Bump when the build recipe below changes, so the cache is rebuilt.
BUILD_REV=1
DIR=$CACHE_ROOT/$VERSION-r$BUILD_REV

log() { printf 'node-feature-discovery-test: %s\n' "$*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

complete() {
	[[ -x $DIR/bin/nfd-worker && -x $DIR/bin/nfd-master && -s $DIR/nfd-api-crds.yaml ]]
}

# moddir MODULE@VERSION: the module's directory in the module cache.
moddir() {
	local json
	json=$(cd "$CACHE_ROOT" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "$1") ||
		die "go mod download $1 failed (no network and no cache?): $json"
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$json"
}

build() {
	complete && return 0
	command -v go >/dev/null || die "go is not installed"
	mkdir -p "$CACHE_ROOT"
	exec 9>"$CACHE_ROOT/.build.lock"
	flock -w 3600 9 || die "timed out waiting for the build lock"
	complete && return 0
	local t0=$SECONDS src api
	log "building Node Feature Discovery $VERSION (first time only: about 2 minutes on 2 cores)"
	src=$(moddir "$MODULE@$VERSION")
	api=$(moddir "$MODULE/api/nfd@$VERSION")
	[[ -d $src && -d $api ]] || die "module directories not found: $src, $api"
	rm -rf "$DIR"
	mkdir -p "$DIR/src"
	cp -r "$src/." "$DIR/src/"
	rm -rf "$DIR/src/api/nfd"
	cp -r "$api/." "$DIR/src/api/nfd/"
	chmod -R u+w "$DIR/src"
	(cd "$DIR/src" && GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 \
		go build -trimpath -ldflags "-s -w -X $MODULE/pkg/version.version=$VERSION" \
		-o "$DIR/bin.tmp/" ./cmd/nfd-worker ./cmd/nfd-master 2> >(grep -v "^go: downloading" >&2)) || die "building nfd-worker and nfd-master $VERSION failed"
	cp "$DIR/src/deployment/base/nfd-crds/nfd-api-crds.yaml" "$DIR/nfd-api-crds.yaml"
	rm -rf "$DIR/src"
	mv "$DIR/bin.tmp" "$DIR/bin"
	printf 'module %s %s\n' "$MODULE" "$VERSION" >"$DIR/VERSION"
	log "built $DIR in $((SECONDS - t0))s"
	exec 9>&-
}

case ${1:-} in
build)
	build
	echo "$DIR"
	;;
dir)
	complete || exit 1
	echo "$DIR"
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac

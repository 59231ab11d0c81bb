#!/usr/bin/env bash
# make demo: a node with two simulated H200 GPUs whose MIG devices pods use,
# a change of one GPU, and which pods stay and which are evicted, and why;
# against a real etcd + kube-apiserver on loopback and the kubelet stand-in
# of the tests. Needs only Go and, on the first run, the Go module proxy.
set -euo pipefail
cd "$(dirname "$0")/.."

# timed LABEL CMD...: run CMD, then say how long it took.
timed() {
	local label=$1 t0=$SECONDS
	shift
	"$@"
	echo "==> $label: $((SECONDS - t0))s"
}

[ -x bin/mig-agent ] || timed "built bin/mig-agent" make build
if ! bash hack/kube-apiserver.sh cached; then
	echo "==> first run: building kube-apiserver and etcd from their Go modules (k8s.io/kubernetes, go.etcd.io/etcd)"
	echo "    about 10 minutes on 2 cores; cached in ${KUBE_TEST_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-test-apiserver}, later runs start in seconds"
	# Only the build's own output is quiet: the timing line shows.
	build_apiserver() { bash hack/kube-apiserver.sh build >/dev/null; }
	timed "built kube-apiserver and etcd" build_apiserver
fi
mkdir -p bin
# The demo driver links client-go: its first build takes a minute or two.
# Go's build cache decides what is stale (every package the driver
# imports), so a later run relinks only what changed, in a second or two.
if [ ! -x bin/demo ]; then
	echo "==> building the demo driver (hack/demo; the first build takes a minute or two, then it is cached)"
	timed "built bin/demo" go build -o bin/demo ./hack/demo
else
	go build -o bin/demo ./hack/demo
fi
exec bin/demo -bin bin/mig-agent

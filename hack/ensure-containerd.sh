#!/usr/bin/env bash
# ensure-containerd.sh: make sure containerd, runc, the CNI plugins and ip
# are installed, for the tests that run a real kubelet (testkit/realnode).
# Idempotent: does nothing when containerd, ctr, runc, ip and the CNI
# plugins bridge, host-local and loopback are already there. Installs
# Debian's containerd, runc, containernetworking-plugins and iproute2
# packages with apt-get, as root. Quiet when it
# works; on failure apt's own error lines are shown. Nothing is started or
# enabled: the tests run containerd themselves, with a private config.
# Exit status non-zero when something is still missing.
set -euo pipefail

log() { echo "ensure-containerd: $*"; }

CNI_DIR=/usr/lib/cni

missing() {
	local m=()
	command -v containerd >/dev/null 2>&1 || m+=(containerd)
	command -v ctr >/dev/null 2>&1 || m+=(ctr)
	command -v runc >/dev/null 2>&1 || m+=(runc)
	command -v ip >/dev/null 2>&1 || m+=(ip)
	[[ -x $CNI_DIR/loopback && -x $CNI_DIR/host-local && -x $CNI_DIR/bridge ]] || m+=("$CNI_DIR/{loopback,host-local,bridge}")
	echo "${m[*]}"
}

versions() {
	echo "$(containerd --version 2>/dev/null | awk '{print $1, $3}'), runc $(runc --version 2>/dev/null | awk 'NR==1 {print $3}'), CNI plugins in $CNI_DIR"
}

m=$(missing)
if [[ -z $m ]]; then
	log "present: $(versions); nothing to do"
	exit 0
fi

sudo=()
if [[ "$(id -u)" -ne 0 ]]; then
	if command -v sudo >/dev/null 2>&1; then
		sudo=(sudo -n)
	else
		log "missing: $m, and not root (no sudo): install containerd, runc, containernetworking-plugins and iproute2" >&2
		exit 1
	fi
fi

command -v apt-get >/dev/null 2>&1 || {
	log "missing: $m, and no apt-get to install containerd, runc, containernetworking-plugins and iproute2 with" >&2
	exit 1
}

# apt_quiet CMD...: run an apt command with its output kept aside, shown only
# when it fails.
apt_quiet() {
	local out rc=0
	out=$("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive "$@" 2>&1) || rc=$?
	if ((rc != 0)); then
		log "'$*' failed (exit $rc):" >&2
		grep -E '^(E|W|Err):|rror' <<<"$out" >&2 || tail -n 20 <<<"$out" >&2
		exit "$rc"
	fi
}

log "missing: $m; installing containerd runc containernetworking-plugins iproute2 with apt-get"
apt_quiet apt-get update -qq
# --no-install-recommends: Debian's containerd recommends nothing the tests use.
# policy-rc.d keeps the package from starting containerd as a host service.
policy=/usr/sbin/policy-rc.d
made_policy=""
if [[ ! -e $policy ]]; then
	printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
	"${sudo[@]}" chmod 755 "$policy"
	made_policy=1
fi
rc=0
(apt_quiet apt-get install -y -qq --no-install-recommends containerd runc containernetworking-plugins iproute2) || rc=$?
[[ -z $made_policy ]] || "${sudo[@]}" rm -f "$policy"
((rc == 0)) || exit "$rc"

m=$(missing)
if [[ -n $m ]]; then
	log "installation finished but still missing: $m" >&2
	exit 1
fi
log "installed: $(versions)"

#!/usr/bin/env bash
# ensure-dbus.sh: make sure dbus-daemon is installed, for the tests that run a
# private bus (testkit/dbustest). Idempotent: does nothing when dbus-daemon
# is already there. Installs Debian's dbus-daemon package (or dbus, on
# releases before the split) with apt-get, as root; also knows dnf and apk.
# Prints what it did. Exit status non-zero when dbus-daemon is still missing.
set -euo pipefail

log() { echo "ensure-dbus: $*"; }

find_daemon() {
	if [[ -n "${MIG_AGENT_DBUS_DAEMON:-}" && -x "${MIG_AGENT_DBUS_DAEMON}" ]]; then
		echo "${MIG_AGENT_DBUS_DAEMON}"
	elif command -v dbus-daemon >/dev/null 2>&1; then
		command -v dbus-daemon
	elif [[ -x /usr/bin/dbus-daemon ]]; then
		echo /usr/bin/dbus-daemon
	else
		return 1
	fi
}

if daemon=$(find_daemon); then
	log "dbus-daemon present: ${daemon} ($("${daemon}" --version 2>/dev/null | head -n1)); nothing to do"
	exit 0
fi

sudo=()
if [[ "$(id -u)" -ne 0 ]]; then
	if command -v sudo >/dev/null 2>&1; then
		sudo=(sudo -n)
	else
		log "dbus-daemon missing and not root (no sudo): install the dbus-daemon package, or set MIG_AGENT_SKIP_DBUS=1 to skip the tests that need it" >&2
		exit 1
	fi
fi

if command -v apt-get >/dev/null 2>&1; then
	log "dbus-daemon missing: running apt-get update"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	pkg=dbus
	# Debian 11+ and Ubuntu 20.10+ ship the daemon in its own package.
	if apt-cache show dbus-daemon >/dev/null 2>&1; then
		pkg=dbus-daemon
	fi
	log "installing ${pkg} with apt-get"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkg}" >/dev/null
elif command -v dnf >/dev/null 2>&1; then
	log "installing dbus-daemon with dnf"
	"${sudo[@]}" dnf install -y -q dbus-daemon
elif command -v apk >/dev/null 2>&1; then
	log "installing dbus with apk"
	"${sudo[@]}" apk add --no-cache -q dbus
else
	log "dbus-daemon missing and no apt-get, dnf or apk to install it with" >&2
	exit 1
fi

if daemon=$(find_daemon); then
	log "installed: ${daemon} ($("${daemon}" --version 2>/dev/null | head -n1))"
else
	log "installation finished but dbus-daemon is still not found" >&2
	exit 1
fi

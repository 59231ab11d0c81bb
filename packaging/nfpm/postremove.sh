#!/bin/sh
# mig-agent post-remove, for .deb and .rpm alike.
#   deb: postrm remove | purge | upgrade NEW_VERSION | ...
#   rpm: %postun N                          (N=0 erase, N>=1 upgrade)
# Reloads systemd so that the removed unit is forgotten. A deb purge also
# deletes the journal in /var/lib/mig-agent; a plain remove and rpm erase keep
# it (it records an unfinished change).
set -e

if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi

if [ "${1:-}" = purge ]; then
	rm -rf "${DPKG_ROOT:-}/var/lib/mig-agent"
fi
exit 0

#!/bin/sh
# mig-agent pre-remove, for .deb and .rpm alike.
#   deb: prerm remove | upgrade NEW_VERSION | deconfigure | failed-upgrade
#   rpm: %preun N                           (N=0 erase, N>=1 upgrade)
# On removal (not on upgrade) the service is stopped and disabled: its binary
# is about to go. The agent journals every step, so a change it was running
# resumes when it is installed and started again.
set -e

remove=false
case "${1:-}" in
remove | 0) remove=true ;;
esac

if [ "$remove" = true ] && [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
	systemctl --no-reload disable --now mig-agent.service >/dev/null 2>&1 || true
fi
exit 0

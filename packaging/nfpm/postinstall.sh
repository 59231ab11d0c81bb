#!/bin/sh
# mig-agent post-install, for .deb and .rpm alike.
#   deb: postinst configure [OLD_VERSION]   (OLD_VERSION empty on first install)
#   rpm: %post N                            (N=1 first install, N>=2 upgrade)
# Enables and starts nothing: a MIG manager that starts by surprise may evict
# pods or reboot the node. It reloads systemd so that the unit is known and
# says what to do next.
set -e

upgrade=false
case "${1:-}" in
configure) [ -z "${2:-}" ] || upgrade=true ;;
abort-upgrade | abort-remove | abort-deconfigure) exit 0 ;;
[2-9] | [1-9][0-9]*) upgrade=true ;;
esac

# Not inside dpkg --root/DPKG_ROOT installs or image builds without systemd.
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi

if [ "$upgrade" = true ]; then
	echo "mig-agent upgraded; a running service keeps the old binary until you restart it:"
	echo "  systemctl try-restart mig-agent.service"
else
	echo "mig-agent installed; nothing was enabled or started. Next:"
	echo "  1. set config-file and selected-config in /etc/mig-agent/settings.yaml"
	echo "     (the unit runs the standalone mode; example: /usr/share/mig-agent/examples/config.yaml)"
	echo "  2. systemctl enable --now mig-agent.service"
	echo "In Kubernetes, run the DaemonSet or Helm chart instead: /usr/share/doc/mig-agent/install.md"
fi
exit 0

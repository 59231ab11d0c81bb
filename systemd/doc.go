// Package systemd is mig-agent's door to the init system: sd_notify
// readiness, status and watchdog pings (go-systemd's daemon package), reboots
// through logind (or systemctl), a logind inhibitor lock held while NVML is
// mid-change, and stopping and restarting host GPU client units through
// systemd's D-Bus API. D-Bus is spoken through godbus on a connection the
// caller opens (ConnectSystemBus), so tests run it against a private
// dbus-daemon with stand-in services (testkit/dbustest).
package systemd

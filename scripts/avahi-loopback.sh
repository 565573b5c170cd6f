#!/usr/bin/env bash
# Starts (or stops) a D-Bus system bus and an avahi-daemon confined to loopback, for the
# discovery tests. mDNS must never leave the machine: allow-interfaces=lo, no wide-area,
# nothing published about the host. Needs root; idempotent.
#   scripts/avahi-loopback.sh start|stop|status
set -euo pipefail
state=/run/ferry-test-avahi
conf=$state/avahi-daemon.conf

running() { avahi-daemon --check 2>/dev/null; }
# The system bus this script may reuse: its socket exists and the daemon in /run/dbus/pid lives.
# (pgrep is not enough: the LAN lab's hosts run their own dbus-daemons, visible from here.)
bus_up() { [ -S /run/dbus/system_bus_socket ] && [ -f /run/dbus/pid ] && kill -0 "$(cat /run/dbus/pid)" 2>/dev/null; }

# Test processes call this concurrently: one caller at a time, or two of them race to
# start the bus ("Failed to open /run/dbus/pid: File exists"). The daemons must not inherit
# the lock's descriptor (9>&-), or they would hold it for as long as they run.
mkdir -p "$state"
exec 9>"$state/lock"
flock 9

case "${1:-start}" in
start)
    [ "$(id -u)" -eq 0 ] || { echo "avahi-loopback: needs root" >&2; exit 1; }
    command -v avahi-daemon >/dev/null || { echo "avahi-loopback: avahi-daemon not installed (scripts/install-deps.sh)" >&2; exit 1; }
    mkdir -p /run/dbus
    if ! bus_up; then
        rm -f /run/dbus/pid /run/dbus/system_bus_socket
        dbus-daemon --system --fork --print-pid > "$state/dbus.pid" 9>&-
    fi
    if running; then
        # Refuse to reuse a daemon that is not confined to loopback.
        if [ -f /run/avahi-daemon/pid ] && [ -f "$state/avahi.pid" ] && [ "$(cat /run/avahi-daemon/pid)" = "$(cat "$state/avahi.pid")" ]; then exit 0; fi
        echo "avahi-loopback: an avahi-daemon not started by this script is running; stop it first" >&2
        exit 1
    fi
    cat > "$conf" <<CONF
[server]
host-name=ferry-test
use-ipv4=yes
use-ipv6=no
allow-interfaces=lo
enable-dbus=yes
ratelimit-interval-usec=1000000
ratelimit-burst=1000
[wide-area]
enable-wide-area=no
[publish]
publish-hinfo=no
publish-workstation=no
publish-addresses=yes
publish-aaaa-on-ipv4=no
[reflector]
enable-reflector=no
CONF
    rm -f /run/avahi-daemon/pid
    avahi-daemon -f "$conf" -D --no-drop-root --no-chroot 9>&-
    for _ in $(seq 1 100); do running && break; sleep 0.05; done
    running || { echo "avahi-loopback: avahi-daemon did not start" >&2; exit 1; }
    cat /run/avahi-daemon/pid > "$state/avahi.pid"
    ;;
stop)
    if [ -f "$state/avahi.pid" ]; then kill "$(cat "$state/avahi.pid")" 2>/dev/null || true; rm -f "$state/avahi.pid"; fi
    ;;
status)
    running && echo running || { echo stopped; exit 1; }
    ;;
esac

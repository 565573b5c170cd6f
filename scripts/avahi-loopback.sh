#!/usr/bin/env bash
# A private D-Bus system bus and avahi-daemon for the discovery tests, in a network
# namespace of their own (only `lo`, up) with a private /run (tmpfs), so they never meet
# the machine's own avahi-daemon or another test run's, and their mDNS never leaves that
# namespace. The bus also listens on a socket in the state directory, so processes outside
# the namespace (the test process, `ferry serve`, avahi-browse) use this avahi-daemon with
# DBUS_SYSTEM_BUS_ADDRESS. Needs root, unshare and nsenter (util-linux).
#
# State (pids, configs, the bus socket) lives in $FERRY_AVAHI_STATE (default
# /var/tmp/ferry-avahi); one directory per instance, so several can run at once.
#
#   avahi-loopback.sh start [PID]   start the namespace; prints "DBUS_SYSTEM_BUS_ADDRESS=…".
#                                   With PID, everything stops by itself when PID exits.
#   avahi-loopback.sh stop          stop every process in the namespace (idempotent)
#   avahi-loopback.sh status        "running" (exit 0) or "stopped" (exit 1)
#   avahi-loopback.sh stop-avahi    stop only avahi-daemon (the bus stays)
#   avahi-loopback.sh start-avahi   start avahi-daemon again, waiting until it runs
#   avahi-loopback.sh run CMD...    run a command inside the namespace (its lo and /run)
set -euo pipefail
. "$(dirname "$(readlink -f "$0")")/avahi-conf.sh"
# Inside the namespace the bus is the default one in its /run; an address inherited from a
# caller may name another instance's bus.
unset DBUS_SYSTEM_BUS_ADDRESS
state=${FERRY_AVAHI_STATE:-/var/tmp/ferry-avahi}
address="unix:path=$state/system_bus_socket"

need_root() { [ "$(id -u)" -eq 0 ] || { echo "avahi-loopback: needs root" >&2; exit 1; }; }
holder() { cat "$state/holder.pid" 2>/dev/null; }
holder_running() { local pid; pid=$(holder) && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }
# Set by `start` once it has started the holder: that pid is surely this instance's.
fresh=""
# Running, and this instance's holder, not a process that reused a stale pid: the holder
# carries its state directory in its environment (unreadable while it is being exec'd,
# hence `fresh`).
holder_alive() {
    holder_running || return 1
    [ -n "$fresh" ] || tr '\0' '\n' < "/proc/$(holder)/environ" 2>/dev/null | grep -qxF "FERRY_AVAHI_STATE=$state"
}
inside() { nsenter --target "$(holder)" --net --mount --wd="$PWD" -- "$@"; }

# Whether avahi-daemon answers on this instance's bus and has its host name (state 2,
# AVAHI_SERVER_RUNNING): asked the way the tests ask, from outside the namespace.
avahi_ready() {
    DBUS_SYSTEM_BUS_ADDRESS=$address dbus-send --system --print-reply --reply-timeout=2000 \
        --dest=org.freedesktop.Avahi / org.freedesktop.Avahi.Server.GetState 2>/dev/null | grep -q "int32 2"
}

wait_ready() {
    for _ in $(seq 1 200); do
        holder_running || break
        avahi_ready && return 0
        sleep 0.05
    done
    avahi_ready || { echo "avahi-loopback: avahi-daemon did not start: $(cat "$state/holder.out" 2>/dev/null)" >&2; return 1; }
}

# Every process in network namespace NS but this script (the holder becomes this script
# when its watched PID exits); never the machine's own namespace.
in_namespace() {
    [ -n "$1" ] && [ "$1" != "$(readlink /proc/1/ns/net)" ] || return 0
    # shellcheck disable=SC2012 # one ls for all processes, not a readlink each
    ls -l /proc/[0-9]*/ns/net 2>/dev/null | grep -F -- "-> $1" | sed -E 's#.*/proc/([0-9]+)/ns/net.*#\1#' | grep -vx "$$" || true
}

start_avahi() {
    # The daemon's pid file is in the namespace's /run; copy it out so `stop` finds it.
    inside bash -c "rm -f /run/avahi-daemon/pid
        avahi-daemon -f '$state/avahi-daemon.conf' -D --no-drop-root --no-chroot --no-rlimits
        cat /run/avahi-daemon/pid" > "$state/avahi.pid"
    wait_ready
}

# Waits until PID has exited (gone, or a zombie nobody has reaped yet).
wait_gone() {
    for _ in $(seq 1 200); do
        # The state follows the command name, which may hold spaces and parentheses.
        [ "$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$1/stat" 2>/dev/null || echo Z)" = Z ] && return 0
        sleep 0.05
    done
}

stop_avahi() {
    local pid
    pid=$(cat "$state/avahi.pid" 2>/dev/null) || return 0
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = avahi-daemon ] || { rm -f "$state/avahi.pid"; return 0; }
    kill "$pid" 2>/dev/null || true
    # Gone from the bus before returning, so a restart never meets the old daemon.
    wait_gone "$pid"
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$state/avahi.pid"
}

stop() {
    local ns="" pids pid
    if holder_alive; then
        ns=$(readlink "/proc/$(holder)/ns/net" 2>/dev/null || true)
        # The holder first, so that it starts nothing more.
        [ "$(holder)" = $$ ] || kill -KILL "$(holder)" 2>/dev/null || true
    fi
    # Then everything in its namespace (the daemons, anything run there), until none is left.
    for _ in 1 2 3 4 5; do
        pids=$(in_namespace "$ns")
        [ -n "$pids" ] || break
        for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
        for pid in $pids; do wait_gone "$pid"; done
    done
    # Daemons whose holder was already gone, if their pids still name them.
    for name in dbus avahi; do
        pid=$(cat "$state/$name.pid" 2>/dev/null) || continue
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name-daemon" ] || continue
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid"
    done
    rm -rf "$state"
}

start() {
    need_root
    local watch=${1:-}
    command -v avahi-daemon >/dev/null || { echo "avahi-loopback: avahi-daemon not installed (scripts/install-deps.sh)" >&2; exit 1; }
    command -v unshare >/dev/null && command -v nsenter >/dev/null || { echo "avahi-loopback: unshare/nsenter missing (util-linux)" >&2; exit 1; }
    if holder_alive && avahi_ready; then echo "DBUS_SYSTEM_BUS_ADDRESS=$address"; return 0; fi
    stop
    mkdir -p "$state"
    trap 'echo "avahi-loopback: start failed; stopping" >&2; stop' ERR
    # mDNS stays on this namespace's lo.
    avahi_conf "$state/avahi-daemon.conf" ferry-test lo
    # The system bus's own configuration (policies for avahi included), plus a second
    # socket outside /run for clients outside the namespace.
    cat > "$state/dbus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <include>/usr/share/dbus-1/system.conf</include>
  <listen>$address</listen>
</busconfig>
CONF
    # The holder keeps the namespaces alive; with a PID to watch it also stops everything
    # when that process exits, even if it never called `stop` (killed, crashed).
    local wait_for="sleep infinity"
    [ -n "$watch" ] && wait_for="tail --pid=$watch -f /dev/null; '$(readlink -f "$0")' stop"
    FERRY_AVAHI_STATE=$state setsid unshare --net --mount --propagation private -- bash -c "
        ip link set lo up
        mount -t tmpfs -o mode=755 tmpfs /run
        mkdir -p /run/dbus /run/avahi-daemon
        dbus-daemon --config-file='$state/dbus.conf' --fork --print-pid > '$state/dbus.pid'
        $wait_for" < /dev/null > "$state/holder.out" 2>&1 &
    echo $! > "$state/holder.pid"
    fresh=1
    for _ in $(seq 1 200); do [ -S "$state/system_bus_socket" ] && break; holder_running || break; sleep 0.05; done
    [ -S "$state/system_bus_socket" ] || { echo "avahi-loopback: dbus-daemon did not start: $(cat "$state/holder.out")" >&2; false; }
    start_avahi
    trap - ERR
    echo "DBUS_SYSTEM_BUS_ADDRESS=$address"
}

case "${1:-}" in
start) start "${2:-}" ;;
stop) need_root; stop ;;
status) if holder_alive && avahi_ready; then echo running; else echo stopped; exit 1; fi ;;
stop-avahi) need_root; stop_avahi ;;
start-avahi) need_root; holder_alive || { echo "avahi-loopback: not started" >&2; exit 1; }; start_avahi ;;
run) shift; holder_alive || { echo "avahi-loopback: not started" >&2; exit 1; }; inside "$@" ;;
*) sed -n 2,19p "$0"; exit 64 ;;
esac

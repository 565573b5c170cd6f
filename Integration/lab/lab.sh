#!/usr/bin/env bash
# The LAN lab: K hosts as network namespaces on one bridge, each with a private /run, its
# own D-Bus and its own avahi-daemon confined to its eth0. Nothing leaves the lab: the
# bridge has no uplink, and every avahi-daemon only uses its host's eth0 inside the lab.
# Run as root. State (pids, configs) lives in $FERRY_LAB_STATE (default /var/tmp/ferry-lab).
#
#   lab.sh up K            create hosts h1..hK (10.213.0.N/24); prints "hN HOLDER_PID" lines
#   lab.sh run N CMD...    run a command on host hN (its network and mounts)
#   lab.sh holder N        print hN's holder pid (for nsenter --target PID --mount --net)
#   lab.sh partition N     take hN's link down (a cable pulled)
#   lab.sh heal N          bring it back
#   lab.sh down            kill every recorded pid and delete the namespaces (idempotent,
#                          also after a failed `up`)
set -euo pipefail
. "$(dirname "$(readlink -f "$0")")/../../scripts/avahi-conf.sh"
# Not under /run: each host mounts its own /run, and must still read its avahi config here.
state=${FERRY_LAB_STATE:-/var/tmp/ferry-lab}
prefix=ferrylab
bridge_ns=${prefix}-br

need_root() { [ "$(id -u)" -eq 0 ] || { echo "lab: needs root" >&2; exit 1; }; }

down() {
    if [ -d "$state" ]; then
        for f in "$state"/*.pid; do
            [ -e "$f" ] || continue
            pid=$(cat "$f")
            # The holder's children (dbus, avahi) live in its namespaces: kill them first.
            pkill -KILL -P "$pid" 2>/dev/null || true
            for child in $(cat "$state"/"$(basename "$f" .pid)".children 2>/dev/null); do kill -KILL "$child" 2>/dev/null || true; done
            kill -KILL "$pid" 2>/dev/null || true
            rm -f "$f"
        done
    fi
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${prefix}-" || true); do
        # Anything still running inside (a ferry node, avahi) dies with the namespace's processes.
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$state"
}

up() {
    local k=$1
    need_root
    command -v avahi-daemon >/dev/null || { echo "lab: avahi-daemon not installed (scripts/install-deps.sh)" >&2; exit 1; }
    down
    mkdir -p "$state"
    trap 'echo "lab: setup failed; tearing down" >&2; down' ERR
    ip netns add "$bridge_ns"
    ip -n "$bridge_ns" link add br0 type bridge
    ip -n "$bridge_ns" link set br0 type bridge mcast_snooping 0
    ip -n "$bridge_ns" link set br0 up
    for n in $(seq 1 "$k"); do
        local ns=${prefix}-h$n
        ip netns add "$ns"
        ip link add "p$n" netns "$bridge_ns" type veth peer name eth0 netns "$ns"
        ip -n "$bridge_ns" link set "p$n" master br0
        ip -n "$bridge_ns" link set "p$n" up
        # IPv4 only: no link-local IPv6 addresses for avahi to hand out.
        ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 || true
        ip -n "$ns" addr add "10.213.0.$n/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        avahi_conf "$state/avahi-h$n.conf" "h$n" eth0
        # LAB_AVAHI=0: hosts with neither D-Bus nor avahi-daemon, as on a minimal install.
        local daemons="dbus-daemon --system --fork
            avahi-daemon -f '$state/avahi-h$n.conf' --no-drop-root --no-chroot --no-rlimits -D"
        [ "${LAB_AVAHI:-1}" = 0 ] && daemons=true
        ip netns exec "$ns" unshare --mount --propagation private -- bash -c "
            mount -t tmpfs -o mode=755 tmpfs /run
            mkdir -p /run/dbus /run/avahi-daemon
            $daemons
            touch /run/ferry-lab-ready
            exec sleep infinity" > "$state/h$n.out" 2>&1 &
        echo $! > "$state/h$n.pid"
    done
    # Wait until every host is up and its avahi-daemon answers (not a fixed sleep).
    local ready="test -e /run/ferry-lab-ready && avahi-daemon --check"
    [ "${LAB_AVAHI:-1}" = 0 ] && ready="test -e /run/ferry-lab-ready"
    for n in $(seq 1 "$k"); do
        local pid
        pid=$(cat "$state/h$n.pid")
        for _ in $(seq 1 200); do
            if nsenter --target "$pid" --mount --net -- bash -c "$ready" 2>/dev/null; then break; fi
            sleep 0.05
        done
        if ! nsenter --target "$pid" --mount --net -- bash -c "$ready"; then
            echo "lab: h$n did not come up: $(cat "$state/h$n.out")" >&2
            down
            exit 1
        fi
        # Record the daemons so `down` finds them even if the holder dies first.
        ip netns pids "${prefix}-h$n" | grep -vx "$pid" > "$state/h$n.children" || true
        echo "h$n $pid"
    done
    trap - ERR
}

holder() { cat "$state/h$1.pid"; }

case "${1:-}" in
up) up "${2:?lab.sh up K}" ;;
down) need_root; down ;;
holder) holder "${2:?host number}" ;;
run)
    n=${2:?host number}
    shift 2
    exec nsenter --target "$(holder "$n")" --mount --net -- "$@"
    ;;
partition) ip -n "$bridge_ns" link set "p${2:?host number}" down ;;
heal) ip -n "$bridge_ns" link set "p${2:?host number}" up ;;
*) sed -n 2,14p "$0"; exit 64 ;;
esac

#!/usr/bin/env bash
# Installs a ferry package into a fresh minimal Debian root of this machine's release
# (mmdebstrap --variant=minbase, from the machine's own apt mirror) with apt and without
# recommends, so the root holds Debian's essential packages plus exactly what the package
# depends on (no Swift toolchain, no avahi-daemon). Then runs a node there as the `ferry`
# user the package created: start, put, get, status, SIGTERM (it must exit 0).
# Usage (root): scripts/clean-root-check.sh dist/ferry_VERSION_ARCH.deb   (make deb-check)
set -euo pipefail
deb=$(readlink -f "${1:?usage: scripts/clean-root-check.sh PACKAGE.deb}")
[ -f "$deb" ] || { echo "clean-root: no package $deb (make deb builds one)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "clean-root: needs root (a chroot)" >&2; exit 1; }
command -v mmdebstrap >/dev/null || { echo "clean-root: needs mmdebstrap (apt-get install mmdebstrap)" >&2; exit 1; }
suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
root=$(mktemp -d /var/tmp/ferry-clean-root.XXXXXX)
node_pid=
cleanup() {
    [ -n "$node_pid" ] && kill -KILL "$node_pid" 2>/dev/null || true
    umount "$root/proc" "$root/dev" 2>/dev/null || true
    rm -rf "$root"
}
trap cleanup EXIT
in_root() { chroot "$root" "$@"; }

echo "clean-root: a minimal $suite root in $root"
mmdebstrap --quiet --variant=minbase "$suite" "$root"
cp "$deb" "$root/tmp/"
# The root keeps no package lists or resolver: apt fetches the dependencies from the machine's mirror.
cp /etc/resolv.conf "$root/etc/resolv.conf"
in_root apt-get update -q > "$root/tmp/apt-update.log" 2>&1 || { cat "$root/tmp/apt-update.log" >&2; exit 1; }
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
in_root apt-get install -y -q --no-install-recommends "/tmp/$(basename "$deb")" > "$root/tmp/apt.log" 2>&1 \
    || { cat "$root/tmp/apt.log" >&2; exit 1; }
echo "clean-root: installed; the package brought: $(grep -o '^Setting up [^ ]*' "$root/tmp/apt.log" | cut -d' ' -f3 | paste -sd' ')"
if in_root ldd /usr/bin/ferry | grep -E 'not found|swift|Foundation'; then
    echo "clean-root: /usr/bin/ferry needs a library the root lacks (above)" >&2
    exit 1
fi
in_root test -f /lib/systemd/system/ferry.service
in_root id ferry > /dev/null

# The node, as the service runs it, on loopback ports chosen by the kernel.
# chroot --userspec execs ferry itself, so the SIGTERM below reaches the node (runuser would take it).
chroot --userspec=ferry:ferry "$root" env HOME=/var/lib/ferry ferry --data /var/lib/ferry serve --ports auto --no-discovery > "$root/tmp/serve.log" 2>&1 &
node_pid=$!
for _ in $(seq 1 200); do
    [ -f "$root/var/lib/ferry/node.json" ] && break
    kill -0 "$node_pid" 2>/dev/null || { cat "$root/tmp/serve.log" >&2; echo "clean-root: the node exited" >&2; exit 1; }
    sleep 0.1
done
[ -f "$root/var/lib/ferry/node.json" ] || { cat "$root/tmp/serve.log" >&2; echo "clean-root: no node.json after 20 s" >&2; exit 1; }
ferry() { chroot "$root" runuser -u ferry -- ferry --data /var/lib/ferry "$@"; }
ferry put clean-root-1 '{"from":"a clean root"}' > /dev/null
[ "$(ferry get clean-root-1 | grep -c 'a clean root')" = 1 ] || { echo "clean-root: get did not return the document" >&2; exit 1; }
ferry status | head -1
kill -TERM "$node_pid"
status=0
wait "$node_pid" || status=$?
node_pid=
[ "$status" = 0 ] || { cat "$root/tmp/serve.log" >&2; echo "clean-root: the node exited $status on SIGTERM" >&2; exit 1; }
echo "clean-root: ok (the node served from the package alone and stopped cleanly)"

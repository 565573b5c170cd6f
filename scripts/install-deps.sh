#!/usr/bin/env bash
# Installs the system packages Ferry builds and tests against, idempotently.
# As root it uses apt-get (and pip for the test-only python-zeroconf); otherwise it says
# what to install and fails.
set -euo pipefail

need=()
[ -f /usr/include/sqlite3.h ] || need+=(libsqlite3-dev)
# zlib: gzip-encoded attachments from CouchDB replicators (Sources/CZlib).
[ -f /usr/include/zlib.h ] || need+=(zlib1g-dev)
# DNS-SD: Avahi's Bonjour-compatible library (build) and the daemon, D-Bus (dbus-send
# checks readiness) and avahi-browse (discovery tests, in a private namespace started by
# scripts/avahi-loopback.sh).
[ -f /usr/include/avahi-compat-libdns_sd/dns_sd.h ] || need+=(libavahi-compat-libdnssd-dev)
command -v avahi-daemon >/dev/null || need+=(avahi-daemon)
command -v avahi-browse >/dev/null || need+=(avahi-utils)
{ command -v dbus-daemon && command -v dbus-send; } >/dev/null || need+=(dbus)
# The tests use the openssl CLI as an independent TLS client, curl-backed URLSession for the admin API.
command -v openssl >/dev/null || need+=(openssl)
# The LAN lab (Integration/lab): network namespaces, nsenter/unshare, and curl inside hosts.
command -v ip >/dev/null || need+=(iproute2)
# scripts/avahi-loopback.sh uses unshare and nsenter too.
{ command -v nsenter && command -v unshare; } >/dev/null || need+=(util-linux)
command -v curl >/dev/null || need+=(curl)
ldconfig -p 2>/dev/null | grep -q 'libcurl.so.4 ' || need+=(libcurl4)
# e2fsprogs: the disk-fault scenario makes an ext4 file system that turns read-only.
{ command -v mkfs.ext4 && command -v e2fsck; } >/dev/null || need+=(e2fsprogs)
# dpkg-deb builds `make deb` (and the packaging tests); systemd-analyze checks the unit.
command -v dpkg-deb >/dev/null || need+=(dpkg)
command -v systemd-analyze >/dev/null || need+=(systemd)
# libfaketime: the clock-jump scenario moves a running node's wall clock (Integration/).
compgen -G '/usr/lib/*/faketime/libfaketimeMT.so.1' >/dev/null || need+=(faketime)
# The dashboard's browser tests (Integration/ui): a real headless Chromium and its driver.
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
# stress-ng: the load scenario (Integration/Scenarios/LoadScenarios.swift) loads the machine.
command -v stress-ng >/dev/null || need+=(stress-ng)
# The CouchDB API suite (Integration/couch) runs in a Python virtualenv.
{ command -v python3 >/dev/null && python3 -c 'import ensurepip' 2>/dev/null; } || need+=(python3-venv)
# `make bench` and `make profile` only (scripts/install-deps.sh --bench): Syncthing, the
# side-by-side peer of P7, and perf for the profiles.
if [ "${1:-}" = "--bench" ]; then
    command -v syncthing >/dev/null || need+=(syncthing)
    command -v perf >/dev/null || need+=(linux-perf)
fi
# `make release` only (scripts/install-deps.sh --release): a static Swift runtime links
# Foundation's networking, which needs libcurl's link-time library.
if [ "${1:-}" = "--release" ]; then
    [ -e /usr/lib/x86_64-linux-gnu/libcurl.so ] || [ -e /usr/lib/aarch64-linux-gnu/libcurl.so ] || need+=(libcurl4-openssl-dev)
fi

if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        echo "Installing system packages: ${need[*]}" >&2
        export DEBIAN_FRONTEND=noninteractive
        # Never let the package start avahi-daemon on the real interfaces (mDNS must not
        # leave the machine): deny service starts while installing.
        created_policy=
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && created_policy=1
        fi
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
        [ -n "$created_policy" ] && rm -f /usr/sbin/policy-rc.d
    else
        echo "Ferry needs these system packages: ${need[*]}" >&2
        echo "Install them with:  sudo apt-get install -y ${need[*]}" >&2
        exit 1
    fi
fi

# python-zeroconf: an mDNS client independent of avahi, for the discovery tests only.
if command -v python3 >/dev/null && ! python3 -c 'import zeroconf' 2>/dev/null; then
    echo "Installing python-zeroconf (tests only)" >&2
    python3 -m pip install -q zeroconf 2>/dev/null || python3 -m pip install -q --break-system-packages zeroconf \
        || echo "warning: could not install python-zeroconf; that discovery check will fail" >&2
fi

# The CouchDB HTTP API suite (Integration/couch): a virtualenv .venv-couch with pytest and the
# CouchDB client libraries pinned in Integration/couch/requirements.txt. Skipped when the
# requirements are unchanged since the last install (a hash stamp inside the venv).
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
requirements="$repo/Integration/couch/requirements.txt"
venv="$repo/.venv-couch"
stamp="$venv/.requirements.sha256"
if [ -f "$requirements" ]; then
    want="$(sha256sum "$requirements" | cut -d' ' -f1)"
    if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
            if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
                echo "Installing python3-venv" >&2
                apt-get update -qq
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
            else
                echo "The CouchDB API suite needs python3-venv: sudo apt-get install -y python3-venv" >&2
                exit 1
            fi
        fi
        echo "Installing the CouchDB API suite's Python packages into .venv-couch" >&2
        # A venv left half-made (an install interrupted before pip was in) is made again.
        if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
            rm -rf "$venv"
        fi
        [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
        "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
        echo "$want" > "$stamp"
    fi
fi

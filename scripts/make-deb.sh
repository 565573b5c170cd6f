#!/usr/bin/env bash
# Builds a Debian package of a ferry binary: /usr/bin/ferry, the systemd unit
# /lib/systemd/system/ferry.service, an empty configuration /etc/ferry/ferry.json (kept on
# upgrade), and a postinst that creates the `ferry` system user and /var/lib/ferry (0700). Dependencies are the
# packages that own the shared libraries the binary links; a library no package owns (the
# Swift runtime of a binary not built with --static-swift-stdlib) is refused.
# Usage: scripts/make-deb.sh BINARY OUTDIR     (make deb builds the binary first)
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:?usage: scripts/make-deb.sh BINARY OUTDIR}
out=${2:?usage: scripts/make-deb.sh BINARY OUTDIR}
[ -x "$binary" ] || { echo "deb: $binary is not an executable (build it with make release)" >&2; exit 1; }
version=$("$binary" --version)
[[ "$version" =~ ^[0-9][0-9A-Za-z.+~-]*$ ]] || { echo "deb: '$binary --version' printed '$version', not a version" >&2; exit 1; }
arch=$(dpkg --print-architecture)

# Every shared library the binary needs must come from a Debian package.
depends=()
unowned=()
while read -r lib; do
    [ -n "$lib" ] || continue
    owner=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null | head -1 | cut -d: -f1) \
        || owner=$(dpkg -S "$lib" 2>/dev/null | head -1 | cut -d: -f1) || owner=
    if [ -z "$owner" ]; then unowned+=("$lib"); else depends+=("$owner"); fi
done < <(
    # The libraries it links directly (NEEDED), found where ldd resolves them: their own
    # dependencies come with their packages.
    needed=$(readelf -d "$binary" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    ldd "$binary" 2>/dev/null | awk -v names="$needed" 'BEGIN { n = split(names, a, "\n"); for (i = 1; i <= n; i++) want[a[i]] = 1 }
        $2 == "=>" && ($1 in want) && $3 ~ /^\// { print $3 }' | sort -u
)
if [ ${#unowned[@]} -gt 0 ]; then
    echo "deb: $binary links libraries no Debian package provides: ${unowned[*]}" >&2
    echo "deb: build it with --static-swift-stdlib (make release) so the Swift runtime is inside it" >&2
    exit 1
fi
# ca-certificates: NIOSSL loads the system CA bundle when it builds the listener's TLS
# context (a minimal root without it failed to start the node), and https sync needs it.
depends_line=$(printf '%s\n' "${depends[@]}" libavahi-compat-libdnssd1 ca-certificates | sort -u | paste -sd, - | sed 's/,/, /g')

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
pkg="$root/ferry_${version}_${arch}"
# Installed stripped: the symbol tables are most of an optimized binary's size.
stripped="$root/ferry"
cp "$binary" "$stripped"
strip --strip-unneeded "$stripped" 2>/dev/null || cp "$binary" "$stripped"
scripts/install.sh "$stripped" "$pkg" /usr /lib/systemd/system >/dev/null
install -D -m 0644 /dev/null "$pkg/etc/ferry/ferry.json"
echo '{}' > "$pkg/etc/ferry/ferry.json"
install -D -m 0644 README.md "$pkg/usr/share/doc/ferry/README.md"
install -D -m 0644 docs/operations.md "$pkg/usr/share/doc/ferry/operations.md"
mkdir -p "$pkg/DEBIAN"
size=$(du -sk "$pkg" | cut -f1)
cat > "$pkg/DEBIAN/control" <<CONTROL
Package: ferry
Version: $version
Architecture: $arch
Maintainer: Ferry developers <ferry@localhost>
Installed-Size: $size
Depends: $depends_line
Recommends: avahi-daemon
Section: database
Priority: optional
Description: peer-to-peer JSON document replication node
 Ferry stores JSON documents in SQLite and keeps them in sync with the other
 Ferry peers on the LAN (TLS WebSocket replication, DNS-SD discovery, pinned
 self-signed certificates), and speaks the CouchDB replication protocol.
CONTROL
echo /etc/ferry/ferry.json > "$pkg/DEBIAN/conffiles"
cat > "$pkg/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    if ! getent passwd ferry >/dev/null; then
        adduser --system --group --home /var/lib/ferry --no-create-home --shell /usr/sbin/nologin ferry >/dev/null 2>&1 \
            || useradd --system --user-group --home-dir /var/lib/ferry --shell /usr/sbin/nologin ferry
    fi
    # The data directory, the user's alone: without systemd (whose StateDirectory= would make
    # it) `sudo -u ferry ferry --data /var/lib/ferry serve` could not create it in /var/lib.
    if [ ! -d /var/lib/ferry ]; then
        install -d -o ferry -g ferry -m 0700 /var/lib/ferry
    fi
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload >/dev/null 2>&1 || true
    fi
    echo "ferry: start it with  systemctl enable --now ferry  (data in /var/lib/ferry, config /etc/ferry/ferry.json)"
fi
exit 0
POSTINST
cat > "$pkg/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
# The data directory (/var/lib/ferry) and the ferry user are kept, even on purge: they
# hold the node's identity and documents.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
POSTRM
chmod 0755 "$pkg/DEBIAN/postinst" "$pkg/DEBIAN/postrm"
mkdir -p "$out"
dpkg-deb --root-owner-group --build "$pkg" "$out/ferry_${version}_${arch}.deb" >/dev/null
echo "$out/ferry_${version}_${arch}.deb"

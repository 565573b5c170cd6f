#!/usr/bin/env bash
# Installs a ferry binary and its systemd unit under DESTDIR/PREFIX (what `make install`
# and `make deb` run): PREFIX/bin/ferry, and the unit (ExecStart pointing at that binary) in
# DESTDIR/UNITDIR. Creates no user and starts nothing.
# Usage: scripts/install.sh BINARY [DESTDIR] [PREFIX] [UNITDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:?usage: scripts/install.sh BINARY [DESTDIR] [PREFIX] [UNITDIR]}
destdir=${2:-}
prefix=${3:-/usr/local}
unitdir=${4:-/etc/systemd/system}
[ -x "$binary" ] || { echo "install: $binary is not an executable (build it with make release)" >&2; exit 1; }
install -D -m 0755 "$binary" "$destdir$prefix/bin/ferry"
mkdir -p "$destdir$unitdir"
sed "s|^ExecStart=/usr/local/bin/ferry |ExecStart=$prefix/bin/ferry |" contrib/ferry.service > "$destdir$unitdir/ferry.service"
chmod 0644 "$destdir$unitdir/ferry.service"
grep -q "^ExecStart=$prefix/bin/ferry " "$destdir$unitdir/ferry.service" \
    || { echo "install: contrib/ferry.service has no ExecStart=/usr/local/bin/ferry line to point at $prefix/bin/ferry" >&2; exit 1; }
echo "installed $destdir$prefix/bin/ferry and $destdir$unitdir/ferry.service"

#!/usr/bin/env bash
# Installs the system packages Ferry builds against, idempotently.
# As root it uses apt-get; otherwise it says what to install and fails.
set -euo pipefail

need=()
[ -f /usr/include/sqlite3.h ] || need+=(libsqlite3-dev)
# The tests use the openssl CLI as an independent TLS client.
command -v openssl >/dev/null || need+=(openssl)

[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "Installing system packages: ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
else
    echo "Ferry needs these system packages: ${need[*]}" >&2
    echo "Install them with:  sudo apt-get install -y ${need[*]}" >&2
    exit 1
fi

#!/usr/bin/env bash
# `make profile`: where the CPU goes in P1, P6, P9 and P13, as flame graphs (SVG) and the top
# 20 functions, one pair per side, in Benchmarks/profiles/ (PROFILE_OUT to write elsewhere).
#
#   P1   bulk pull over TLS: the serving node (`serve`) and the pulling client (`sync`)
#   P6   local saves through the store (the benchmark process itself)
#   P9   one write through the LAN lab's mesh (`serve`, every node's samples together; root only)
#   P13  indexed Mango queries (the benchmark process itself)
#
# A benchmark that starts `ferry` processes runs while `perf record -a` samples the whole
# machine; ferry-bench lists each process's PID and role (FERRY_BENCH_PROFILE), and each
# side's graph is drawn from its processes' samples. An in-process benchmark runs under
# `perf record`. Raw samples stay in .build/profiles/. PROFILE_ONLY="P1 P6" limits the set;
# `scripts/profile.sh --render` draws the graphs again from the samples already taken.
set -euo pipefail
cd "$(dirname "$0")/.."

out=${PROFILE_OUT:-Benchmarks/profiles}
raw=.build/profiles
bench=.build/release/ferry-bench
only=${PROFILE_ONLY:-P1 P6 P9 P13}
command -v perf >/dev/null || { echo "profile: perf is missing (Debian: apt-get install linux-perf)" >&2; exit 2; }
[ -x "$bench" ] || { echo "profile: $bench is missing (make profile builds it)" >&2; exit 2; }
render_only=
[ "${1:-}" = --render ] && render_only=1
[ -n "$render_only" ] || rm -rf "$raw"
mkdir -p "$raw" "$out"

wants() { [[ " $only " == *" $1 "* ]]; }

# DWARF unwinding names the callers of libraries built without frame pointers (zlib,
# SQLite); 8 KiB of stack a sample at 199 Hz keeps a run's file to tens of MB.
record=(perf record -q --call-graph dwarf,8192 -F 199)

children() { # NAME ARGS…: the machine is sampled; the benchmark lists its ferry processes
    local name=$1
    shift
    [ -z "$render_only" ] || return 0
    echo "profile: $name: ferry-bench $*"
    mkdir -p "$raw/$name"
    FERRY_BENCH_PROFILE="$PWD/$raw/$name" "${record[@]}" -a -o "$raw/$name/all.perf" -- "$bench" "$@" >"$raw/$name.log"
}

itself() { # NAME ARGS…: the benchmark process is sampled
    local name=$1
    shift
    [ -z "$render_only" ] || return 0
    echo "profile: $name: ferry-bench $*"
    mkdir -p "$raw/$name"
    "${record[@]}" -o "$raw/$name/all.perf" -- "$bench" "$@" >"$raw/$name.log"
}

# Writes OUT/NAME-ROLE.svg and .txt from the samples of that role's processes (ROLE bench:
# every sample of an in-process benchmark).
render() { # NAME ROLE TITLE
    local name=$1 role=$2 title=$3 filter=()
    if [ "$role" != bench ]; then
        local pids
        pids=$(awk -v r="$role" '$2 == r { print $1 }' "$raw/$name/pids" 2>/dev/null | paste -sd, -)
        [ -n "$pids" ] || { echo "profile: $name: no $role process was started" >&2; return 1; }
        filter=(--pid "$pids")
    fi
    perf script -i "$raw/$name/all.perf" "${filter[@]}" 2>/dev/null |
        python3 scripts/flamegraph.py --title "$title" --svg "$out/$name-$role.svg" --top "$out/$name-$role.txt"
    echo "profile: $out/$name-$role.svg, $out/$name-$role.txt"
}

if wants P1; then
    children P1 net --count 100000 --runs 1
    render P1 serve "P1: the node serving a bulk pull of 100k x 1 KiB over TLS"
    render P1 sync "P1: ferry sync pulling 100k x 1 KiB over TLS and storing them"
fi
if wants P6; then
    itself P6 store --count 100000 --runs 1
    render P6 bench "P6: 100k local saves through the store (and the raw SQLite inserts beside them)"
fi
if wants P9; then
    if [ "$(id -u)" = 0 ]; then
        children P9 lan --hosts 16 --docs 1000 --writes 50
        render P9 serve "P9: the 16 nodes of the LAN lab (a join, then single writes through the mesh)"
    else
        echo "profile: P9 skipped (the LAN lab needs root)"
    fi
fi
if wants P13; then
    itself P13 find --docs 200000 --write-docs 20000 --runs 1 --queries 500 --scans 1
    render P13 bench "P13: indexed Mango queries on 200k documents (and the hand-written SQL beside them)"
fi

#!/usr/bin/env bash
# Runs every libFuzzer target of ferry-fuzz for SECONDS each (default 60), starting from the
# committed corpus Fuzz/corpus/TARGET, and prints executions, coverage and crashes per target.
# New inputs go to .build-fuzz/corpus/TARGET (not committed); a crash is written to
# Fuzz/crashes/TARGET-crash-* and fails the run: commit it to Fuzz/corpus/TARGET once fixed.
# With FUZZ_RUNS=N, each target stops after N executions instead (SECONDS is then a cap):
# the soak is FUZZ_RUNS=1000000 scripts/fuzz.sh 3600. FUZZ_SEED=N fixes libFuzzer's random
# seed, so that a short run (make test's) tries the same inputs every time.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (after `make fuzz` has built .build-fuzz)
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
binary=.build-fuzz/debug/ferry-fuzz
[ -x "$binary" ] || { echo "fuzz: $binary is not built (run make fuzz)" >&2; exit 2; }
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(ls Fuzz/corpus)
mkdir -p Fuzz/crashes
failed=0
printf '%-12s %12s %10s %8s %s\n' target executions "exec/s" cov result
for t in "${targets[@]}"; do
    [ -d "Fuzz/corpus/$t" ] || { echo "fuzz: no corpus Fuzz/corpus/$t" >&2; exit 2; }
    work=.build-fuzz/corpus/$t
    mkdir -p "$work"
    log=.build-fuzz/$t.log
    # -rss_limit_mb and -timeout turn a leak-like growth or a hang into a reported failure.
    FERRY_FUZZ_TARGET=$t ASAN_OPTIONS=detect_leaks=1 "$binary" "$work" "Fuzz/corpus/$t" \
        -max_total_time="$seconds" ${FUZZ_RUNS:+-runs=$FUZZ_RUNS} ${FUZZ_SEED:+-seed=$FUZZ_SEED} -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="Fuzz/crashes/$t-" > "$log" 2>&1
    status=$?
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    rate=$(grep -E '^stat::average_exec_per_sec' "$log" | awk '{print $2}')
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | awk '{print $2}')
    if [ $status -eq 0 ]; then result=ok; else result="FAILED (exit $status, see $log)"; failed=1; fi
    printf '%-12s %12s %10s %8s %s\n' "$t" "${runs:-?}" "${rate:-?}" "${cov:-?}" "$result"
done
exit $failed

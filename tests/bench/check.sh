#!/usr/bin/env bash
# Runs every benchmark in turn and judges each against tests/bench/targets.toml. As root:
#
#   tests/bench/check.sh            # full runs, the scale the docs' figures are taken at
#   tests/bench/check.sh --smoke    # BENCH_SMOKE=1: reduced scale, under 10 minutes here
#   tests/bench/check.sh --smoke run.sh portmap.sh   # only these benchmarks
#
# It keeps going past a benchmark that misses a figure or fails, times each, prints every
# verdict table (judge.py appends them to $BENCH_OUT/verdicts.md, emptied here first) and
# a last line naming every missed figure, and exits non-zero if any benchmark missed or
# failed. The plugins are built once (the static release as shipped) for all benchmarks
# that run them. A benchmark that is not in the tree, or (with --smoke) one that has no
# reduced scale (does not read BENCH_SMOKE), fails the run: a figure nobody measures must
# not pass. CNI_RS_SKIP_VM=1 (a developer's shortcut, refused under CI by
# tests/run-all.sh) leaves out the benchmarks that boot the stock-kernel VM and names
# them in the last line.
# Environment: BENCH_OUT (default target/bench), BENCH_TARGETS, and each benchmark's own.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

unset BENCH_SMOKE BENCH_QUICK
if [[ ${1:-} == --smoke ]]; then
    export BENCH_SMOKE=1
    shift
fi
for only in "$@"; do
    [[ $only != -* ]] || { echo "usage: tests/bench/check.sh [--smoke] [benchmark.sh ...]" >&2; exit 2; }
done
[[ $(id -u) -eq 0 ]] || { echo "error: run as root (network namespaces)" >&2; exit 1; }

export BENCH_OUT=${BENCH_OUT:-target/bench}
mkdir -p "$BENCH_OUT"
BENCH_OUT=$(cd "$BENCH_OUT" && pwd)
verdicts=$BENCH_OUT/verdicts.md
: >"$verdicts"
run=${BENCH_SMOKE:+smoke}
run=${run:-full}

if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi
started=$(date +%s)
if [[ -z ${BENCH_OURS_DIR:-} ]]; then
    echo "==> tests/plugin-dir.sh static (the release build as shipped)"
    build_start=$(date +%s)
    BENCH_OURS_DIR=$(tests/plugin-dir.sh static)
    echo "build took $(($(date +%s) - build_start)) s"
fi
export BENCH_OURS_DIR

# The benchmarks in the order they run: the plugins', then the node agent's.
benches=(
    tests/bench/run.sh
    tests/bench/soak.sh
    tests/bench/portmap.sh
    tests/bench/bandwidth.sh
    tests/bench/host-local.sh
    tests/bench/cluster.sh
    tests/bench/network-policy.sh
    tests/bench/agent-soak.sh
    tests/bench/contracts.sh
    tests/bench/encryption.sh
)
failed=()
absent=()
skipped=()
timings=()
if (($#)); then
    benches=("${@/#/tests/bench/}")
fi
for bench in "${benches[@]}"; do
    if [[ ! -f $bench ]]; then
        echo
        echo "!!! $bench: NOT PRESENT (not run)"
        absent+=("$bench")
        continue
    fi
    if [[ ${CNI_RS_SKIP_VM:-} == 1 ]] && grep -q 'tests/vm/lib.sh' "$bench"; then
        # A developer's shortcut (tests/run-all.sh refuses it under CI): a benchmark that
        # boots the stock-kernel VM is not run, and the last line says so.
        echo
        echo "!!! $bench: boots the stock-kernel VM: SKIPPED (CNI_RS_SKIP_VM=1)"
        skipped+=("$bench")
        continue
    fi
    if [[ -n ${BENCH_SMOKE:-} ]] && ! grep -q BENCH_SMOKE "$bench"; then
        # A benchmark that knows no reduced scale would run at full scale here.
        echo
        echo "!!! $bench: has no smoke scale (no BENCH_SMOKE in it): NOT RUN"
        absent+=("$bench (no smoke scale)")
        continue
    fi
    echo
    echo "==> $bench ($run run)"
    t0=$(date +%s)
    status=0
    bash "$bench" || status=$?
    took=$(($(date +%s) - t0))
    timings+=("$bench: ${took} s, exit $status")
    echo "<== $bench: exit $status after $took s"
    ((status == 0)) || failed+=("$bench (exit $status)")
done

echo
echo "==> verdicts ($run run)"
echo
cat "$verdicts"
echo "==> times"
printf '  %s\n' "${timings[@]}"
echo "  all: $(($(date +%s) - started)) s"
for bench in "${absent[@]}"; do
    echo "!!! $bench: not present or not run"
    failed+=("$bench (not run)")
done
# Every MISSED row of the tables, by name.
missed=$(awk -F' [|] ' '/MISSED/ { sub(/^[|] /, "", $1); printf "%s%s", sep, $1; sep = ", " }' "$verdicts")
if ((${#failed[@]})) || [[ -n $missed ]]; then
    echo "MISSED: ${missed:-no figure}; benchmarks that failed or missed: ${failed[*]:-none}"
    exit 1
fi
if ((${#skipped[@]})); then
    echo "the benchmarks run met their targets ($run run); NOT RUN (CNI_RS_SKIP_VM=1): ${skipped[*]}"
    exit 0
fi
echo "all benchmarks met their targets ($run run)"

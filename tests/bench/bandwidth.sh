#!/usr/bin/env bash
# Benchmark: bandwidth ADD and DEL (ingress and egress limits) after a bridge ADD, ours
# (release build) against the reference (/usr/lib/cni/bandwidth), suites alternating in
# one run; then ping latency through a shaped pod under a saturating TCP transfer.
# Run as root:
#
#   tests/bench/bandwidth.sh                 # 3 rounds of 30 pods per suite, 4 x 1500 pings
#   BENCH_SMOKE=1 tests/bench/bandwidth.sh   # 6 rounds of 3 pods, 3 x 400 pings
#
# Environment: REFERENCE_DIR (default /usr/lib/cni), BENCH_OURS_DIR (default: build the
# static release and use its cni-bin/), BENCH_ROUNDS, BENCH_PODS, BENCH_PINGS,
# BENCH_PING_ROUNDS, BENCH_OUT (default target/bench). Everything runs in throwaway network namespaces, removed on
# exit. Prints Markdown tables (docs/performance.md, "bandwidth"), writes
# $BENCH_OUT/figures/bandwidth.tsv
# and ends with tests/bench/judge.py bandwidth: non-zero if a figure misses its bound in
# tests/bench/targets.toml or a call failed. BENCH_JUDGE=0 skips the judging.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

[[ $(id -u) -eq 0 ]] || { echo "error: run as root (network namespaces)" >&2; exit 1; }
REFERENCE_DIR=${REFERENCE_DIR:-/usr/lib/cni}
[[ -x $REFERENCE_DIR/bandwidth ]] || {
    echo "error: no reference bandwidth in $REFERENCE_DIR (apt-get install containernetworking-plugins)" >&2
    exit 1
}
if [[ -z ${BENCH_OURS_DIR:-} ]]; then
    if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
        # shellcheck source=/dev/null
        . "${HOME:-/root}/.cargo/env"
    fi
    echo "==> cargo build --release (static, as deploy/release.sh ships it)" >&2
    BENCH_OURS_DIR=$(tests/plugin-dir.sh static)
fi
export BENCH_TAG=${BENCH_TAG:-cw$$}
cleanup() {
    for ns in $(ip netns list | awk '{print $1}' | grep "^${BENCH_TAG}-" || true); do
        ip netns delete "$ns" 2>/dev/null || true
    done
}
trap cleanup EXIT

out=${BENCH_OUT:-target/bench}
smoke=()
if [[ -n ${BENCH_SMOKE:-} && ${BENCH_SMOKE} != 0 || -n ${BENCH_QUICK:-} && ${BENCH_QUICK} != 0 ]]; then
    export BENCH_SMOKE=1
    smoke=(--smoke)
fi
status=0
/usr/bin/python3 tests/bench/bandwidth.py --ours "$BENCH_OURS_DIR" --ref "$REFERENCE_DIR" \
    --out "$out" "${smoke[@]}" || status=$?
if [[ ${BENCH_JUDGE:-1} == 0 ]]; then
    echo "bandwidth: not judged (BENCH_JUDGE=0)" >&2
else
    BENCH_OUT=$out /usr/bin/python3 tests/bench/judge.py bandwidth || status=1
fi
exit "$status"

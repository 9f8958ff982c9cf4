#!/usr/bin/env bash
# Benchmark: portmap ADD, CHECK and DEL, ours (release build, iptables and nftables)
# against the reference (/usr/lib/cni/portmap, iptables), suites alternating in one run.
# Run as root:
#
#   tests/bench/portmap.sh                   # 3 rounds of 30 pods per suite
#   BENCH_SMOKE=1 tests/bench/portmap.sh     # 6 rounds of 3 pods (BENCH_QUICK=1 too)
#
# Environment: REFERENCE_DIR (default /usr/lib/cni), BENCH_OURS_DIR (default: build the
# static release and use its cni-bin/), BENCH_ROUNDS, BENCH_PODS, BENCH_OUT (default
# target/bench). Everything runs in throwaway network namespaces, removed on exit. Prints
# a Markdown table (docs/performance.md, "portmap"), writes $BENCH_OUT/figures/portmap.tsv
# and ends with tests/bench/judge.py portmap: non-zero if a figure misses its bound in
# tests/bench/targets.toml or a call failed. BENCH_JUDGE=0 skips the judging.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

[[ $(id -u) -eq 0 ]] || { echo "error: run as root (network namespaces)" >&2; exit 1; }
REFERENCE_DIR=${REFERENCE_DIR:-/usr/lib/cni}
[[ -x $REFERENCE_DIR/portmap ]] || {
    echo "error: no reference portmap in $REFERENCE_DIR (apt-get install containernetworking-plugins)" >&2
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
export BENCH_TAG=${BENCH_TAG:-cp$$}
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
/usr/bin/python3 tests/bench/portmap.py --ours "$BENCH_OURS_DIR" --ref "$REFERENCE_DIR" \
    --out "$out" "${smoke[@]}" || status=$?
if [[ ${BENCH_JUDGE:-1} == 0 ]]; then
    echo "portmap: not judged (BENCH_JUDGE=0)" >&2
else
    BENCH_OUT=$out /usr/bin/python3 tests/bench/judge.py portmap || status=1
fi
exit "$status"

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
# shellcheck source=tests/bench/chained-plugin.sh
. tests/bench/chained-plugin.sh
chained_plugin_bench bandwidth cw tests/bench/bandwidth.py

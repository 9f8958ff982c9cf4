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
# shellcheck source=tests/bench/chained-plugin.sh
. tests/bench/chained-plugin.sh
chained_plugin_bench portmap cp tests/bench/portmap.py

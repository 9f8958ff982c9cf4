#!/usr/bin/env bash
# Soak: CNI_SOAK_CYCLES (default 5000) ADD/DEL cycles of one pod slot, bridge + host-local,
# dual-stack, masquerade on, inside throwaway namespaces, with the release build. Runs the
# soak test (tests/tests/soak.rs), which asserts that nothing grew (reservation files,
# links, addresses, routes, neighbours, FDB, iptables/nftables rules, conntrack count, peak
# RSS of the plugin processes) and prints the figures: p50/p99 of ADD and DEL wall time in
# the first and the last tenth of the run, and the peak RSS. Timing is printed, not judged.
#
#   tests/bench/soak.sh                                # 5000 cycles, our release build
#   CNI_SOAK_CYCLES=500 CNI_SOAK_BACKEND=nftables tests/bench/soak.sh
#   SOAK_BIN_DIR=/usr/lib/cni tests/bench/soak.sh      # the same soak on the reference
#
# CI runs the same test with 100 cycles (debug build) as part of tests/run-all.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

[[ $(id -u) -eq 0 ]] || { echo "error: run as root (network namespaces)" >&2; exit 1; }
export CNI_SOAK_CYCLES=${CNI_SOAK_CYCLES:-5000}

if [[ -n ${SOAK_BIN_DIR:-} ]]; then
    dir=$SOAK_BIN_DIR
else
    dir=$(tests/plugin-dir.sh release)
fi
[[ -x $dir/bridge && -x $dir/host-local ]] || { echo "error: no bridge/host-local in $dir" >&2; exit 1; }
echo "soak: $CNI_SOAK_CYCLES cycles of $dir/bridge (ipMasqBackend ${CNI_SOAK_BACKEND:-default})"
CNI_BLACKBOX_BIN_DIR=$dir cargo test -q -p cni-blackbox --test soak -- --nocapture

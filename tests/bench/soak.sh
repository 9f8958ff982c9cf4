#!/usr/bin/env bash
# Soak of the plugins, judged against the [soak.*] targets of tests/bench/targets.toml:
# CNI_SOAK_CYCLES ADD/DEL cycles of one pod slot, bridge + host-local, dual-stack,
# masquerade on, inside throwaway namespaces, with the static release build as shipped
# (tests/plugin-dir.sh static, or $BENCH_OURS_DIR from tests/bench/check.sh). Runs the
# soak test (tests/tests/soak.rs), which asserts that nothing grew (reservation files,
# links, addresses, routes, neighbours, FDB, iptables/nftables rules, peak RSS of the
# child processes) and prints its figures on a `soak-figures` line: how many kinds of
# state grew, the reservations and pod interfaces left, the plugins' peak RSS, and p50 of
# an ADD + DEL in the last tenth of the run over the first, in wall and in CPU time.
# They go to $BENCH_OUT/figures/soak.tsv (BENCH_OUT defaults to target/bench), the
# test's output to $BENCH_OUT/soak/soak.out, the run's circumstances to
# $BENCH_OUT/soak/machine.txt; then tests/bench/judge.py soak judges them.
#
#   tests/bench/soak.sh                                # 5,000 cycles
#   BENCH_SMOKE=1 tests/bench/soak.sh                  # 200 cycles, under a minute
#   CNI_SOAK_CYCLES=500 CNI_SOAK_BACKEND=nftables tests/bench/soak.sh
#   SOAK_BIN_DIR=/usr/lib/cni tests/bench/soak.sh      # the same soak on the reference
#
# CI runs the same test with 100 cycles (debug build) as part of tests/run-all.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

[[ $(id -u) -eq 0 ]] || { echo "error: run as root (network namespaces)" >&2; exit 1; }
if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi
run=full
[[ ${BENCH_SMOKE:-0} != 0 && -n ${BENCH_SMOKE:-} ]] && run=smoke
if [[ $run == smoke ]]; then
    export CNI_SOAK_CYCLES=${CNI_SOAK_CYCLES:-200}
else
    export CNI_SOAK_CYCLES=${CNI_SOAK_CYCLES:-5000}
fi
out=${BENCH_OUT:-target/bench}
mkdir -p "$out/figures" "$out/soak"
: >"$out/figures/soak.tsv"
started=$(date +%s)
load0=$(cut -d' ' -f1 /proc/loadavg)

dir=${SOAK_BIN_DIR:-${BENCH_OURS_DIR:-}}
[[ -n $dir ]] || dir=$(tests/plugin-dir.sh static)
[[ -x $dir/bridge && -x $dir/host-local ]] || { echo "error: no bridge/host-local in $dir" >&2; exit 1; }
echo "soak: $CNI_SOAK_CYCLES cycles of $dir/bridge (ipMasqBackend ${CNI_SOAK_BACKEND:-default}, $run run)"
cargo test -q --no-run -p cni-blackbox --test soak
failed=0
CNI_BLACKBOX_BIN_DIR=$dir cargo test -q -p cni-blackbox --test soak -- --nocapture \
    >"$out/soak/soak.out" 2>&1 || failed=1
grep -v '^state at the end\|^conntrack\|^ *"\|^\]' "$out/soak/soak.out" | head -20
((failed == 0)) || { tail -40 "$out/soak/soak.out"; echo "soak: the test failed (output in $out/soak/soak.out)" >&2; }
grep '^soak-figures ' "$out/soak/soak.out" |
    awk '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); printf "soak.%s\t%s\n", kv[1], kv[2] } }' \
        >"$out/figures/soak.tsv"
{
    echo "run: $run"
    echo "date: $(date -u -d "@$started" '+%Y-%m-%d %H:%M UTC')"
    echo "machine: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)"
    commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
    [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]] && commit+="+changes"
    echo "commit: $commit"
    echo "load: $load0 at the start, $(cut -d' ' -f1 /proc/loadavg) at the end"
    echo "duration: $(($(date +%s) - started)) s"
    echo "scale: $CNI_SOAK_CYCLES ADD/DEL cycles, static release build, ipMasqBackend ${CNI_SOAK_BACKEND:-default}"
} >"$out/soak/machine.txt"
judged=0
/usr/bin/python3 tests/bench/judge.py soak || judged=$?
exit $((failed ? 1 : judged))

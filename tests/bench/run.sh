#!/usr/bin/env bash
# Benchmark: bridge + host-local ADD, CHECK and DEL, ours (release build) against the
# reference plugins (/usr/lib/cni, Debian containernetworking-plugins) and the kernel
# floor (the same links, addresses and routes made with `ip -batch`; DEL = a bare
# `ip link del` of the veth), suites alternating in one run. Run as root:
#
#   tests/bench/run.sh                   # full run, about 3 minutes on 2 CPUs
#   BENCH_SMOKE=1 tests/bench/run.sh     # reduced scale, about a minute (BENCH_QUICK=1 too)
#
# It writes its figures to $BENCH_OUT/figures/plugins.tsv and ends with
# tests/bench/judge.py plugins: the exit status is non-zero if a figure misses its bound
# in tests/bench/targets.toml (the smoke bounds with BENCH_SMOKE=1) or a plugin call
# failed. BENCH_JUDGE=0 skips the judging (the debug build's run in
# tests/tests/bench_smoke.rs, whose timings mean nothing); a BENCH_ONLY run is not judged
# either (the parts it leaves out would count as missed).
# Environment: BENCH_OUT (default target/bench: summary.csv, samples.csv,
# concurrent.csv, sizes.csv, machine.txt, bench.png), REFERENCE_DIR (default
# /usr/lib/cni), BENCH_OURS_DIR (default: build the static release as shipped and use
# its cni-bin/, the plugin names as hard links of the multi-call binary), BENCH_ROUNDS and
# BENCH_PODS (rounds per scenario, pods per suite and round: default 3 and 15), BENCH_ONLY
# (comma-separated words: run only the parts whose names contain one, e.g. ipv4,nftables,
# 250,portSecurity,podRecordDir,concurrent,sizes).
# Everything runs in throwaway network namespaces (never the machine's own), removed on
# exit. Prints Markdown tables; see docs/performance.md.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

[[ $(id -u) -eq 0 ]] || { echo "error: run as root (network namespaces)" >&2; exit 1; }
REFERENCE_DIR=${REFERENCE_DIR:-/usr/lib/cni}

# iproute2 (ip -batch, netns), iptables/nftables (masquerade backends), the reference
# plugins, GNU time (peak RSS) and Debian's matplotlib for the chart (run with Debian's
# python3, whatever python3 comes first in PATH).
packages=(iproute2 iptables nftables containernetworking-plugins time python3 python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "==> apt-get install ${missing[*]}" >&2
    apt-get -o DPkg::Lock::Timeout=900 update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q \
        --no-install-recommends "${missing[@]}" >&2
fi
[[ -x $REFERENCE_DIR/bridge ]] || { echo "error: no reference bridge in $REFERENCE_DIR" >&2; exit 1; }

if [[ -z ${BENCH_OURS_DIR:-} ]]; then
    if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
        # shellcheck source=/dev/null
        . "${HOME:-/root}/.cargo/env"
    fi
    echo "==> cargo build --release (static, as deploy/release.sh ships it)" >&2
    # As shipped: the plugin names are hard links of the one static multi-call
    # executable, so the bridge runs host-local in-process.
    BENCH_OURS_DIR=$(tests/plugin-dir.sh static)
fi
out=${BENCH_OUT:-target/bench}
mkdir -p "$out"

# Backstop for the driver's own cleanup: every namespace it creates starts with this tag.
export BENCH_TAG=${BENCH_TAG:-cb$$}
cleanup() {
    for ns in $(ip netns list | awk '{print $1}' | grep "^${BENCH_TAG}-" || true); do
        ip netns delete "$ns" 2>/dev/null || true
    done
}
trap cleanup EXIT

smoke=()
if [[ -n ${BENCH_SMOKE:-} && ${BENCH_SMOKE} != 0 || -n ${BENCH_QUICK:-} && ${BENCH_QUICK} != 0 ]]; then
    export BENCH_SMOKE=1
    smoke=(--smoke)
fi
status=0
/usr/bin/python3 tests/bench/bench.py --ours "$BENCH_OURS_DIR" --ref "$REFERENCE_DIR" \
    --out "$out" "${smoke[@]}" || status=$?
if [[ ${BENCH_JUDGE:-1} == 0 ]]; then
    echo "plugins: not judged (BENCH_JUDGE=0)" >&2
elif [[ -n ${BENCH_ONLY:-} ]]; then
    echo "plugins: not judged (BENCH_ONLY=$BENCH_ONLY is a partial run)" >&2
else
    BENCH_OUT=$out /usr/bin/python3 tests/bench/judge.py plugins || status=1
fi
exit "$status"

#!/usr/bin/env bash
# Pod to pod traffic through the node agent's network, direct and through the VXLAN
# overlay, in one run (docs/kubernetes.md, "Nodes behind a router"): two underlay
# segments joined by a router namespace, nodes 1 and 2 on one, node 3 on the other,
# dual-stack, the built cni-node on each, one pod per node. From node 1's pod: one TCP
# stream for OVERLAY_TRAFFIC_SECS seconds (default 3) and 5,000 one-byte
# request/response round trips over TCP, to node 2's pod (direct) and to node 3's
# (encapsulated), IPv4 and IPv6. Sockets are opened in the namespaces by the test
# itself, so no traffic tool is needed (the test is built like the suite: what is
# measured is the kernel's path, not the test's code). Lines are also written to
# $BENCH_OUT/overlay-traffic.txt (default target/bench), and as figures
# (`overlay_traffic.<path>_<family>_<figure>`) to $BENCH_OUT/figures/overlay_traffic.tsv,
# with the run's circumstances in $BENCH_OUT/overlay_traffic/machine.txt: no page calls
# these a target, so they are recorded (tests/bench/write-docs.py --record
# overlay_traffic), not judged.
#
#   sudo tests/bench/overlay-traffic.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi
out=${BENCH_OUT:-target/bench}
mkdir -p "$out/figures" "$out/overlay_traffic"
started=$(date +%s)
load0=$(cut -d' ' -f1 /proc/loadavg)
CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0} cargo test -p cni-blackbox --test overlay -- --ignored --nocapture \
    traffic_direct_and_encapsulated 2>&1 |
    grep '^overlay-traffic ' | tee "$out/overlay-traffic.txt"
# path=direct family=IPv4 pod_mtu=1430 tcp_gbit_s=10.70 rr_p50_us=12.4 ... as
# overlay_traffic.direct_ipv4_tcp_gbit_s<TAB>10.70, one line a figure.
awk '{ split($2, p, "="); split($3, f, "="); key = p[2] "_" tolower(f[2])
       for (i = 4; i <= NF; i++) { split($i, kv, "="); printf "overlay_traffic.%s_%s\t%s\n", key, kv[1], kv[2] } }' \
    "$out/overlay-traffic.txt" >"$out/figures/overlay_traffic.tsv"
[[ $(wc -l <"$out/overlay-traffic.txt") -eq 4 ]] || { echo "overlay-traffic: want 4 lines (2 paths x 2 families)" >&2; exit 1; }
{
    echo "run: full"
    echo "date: $(date -u -d "@$started" '+%Y-%m-%d %H:%M UTC')"
    echo "machine: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)"
    commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
    [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]] && commit+="+changes"
    echo "commit: $commit"
    echo "load: $load0 at the start, $(cut -d' ' -f1 /proc/loadavg) at the end"
    echo "duration: $(($(date +%s) - started)) s"
    echo "scale: one TCP stream for ${OVERLAY_TRAFFIC_SECS:-3} s and 5,000 request/response round trips a path and family"
} >"$out/overlay_traffic/machine.txt"
echo "recorded in $out/overlay-traffic.txt and $out/figures/overlay_traffic.tsv"

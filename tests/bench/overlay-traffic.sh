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
# $BENCH_OUT/overlay-traffic.txt (default target/bench).
#
#   sudo tests/bench/overlay-traffic.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi
out=${BENCH_OUT:-target/bench}
mkdir -p "$out"
CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0} cargo test -p cni-blackbox --test overlay -- --ignored --nocapture \
    traffic_direct_and_encapsulated 2>&1 |
    grep '^overlay-traffic ' | tee "$out/overlay-traffic.txt"
echo "recorded in $out/overlay-traffic.txt"

#!/usr/bin/env bash
# Scale benchmark of the node agent (docs/kubernetes.md, "Kubernetes cluster network"),
# judged against the [cluster.*] targets of tests/bench/targets.toml. The API test
# server holds N realistic Nodes (~15 KB each) and one cni-node, built as the release
# builds it (tests/bench/static-agent.sh), syncs them in a throwaway network namespace.
# Measured per size: the initial sync to every route in the kernel, the peak RSS, the
# time from a served node change to its route (p50/p99 over 200 additions), and the
# latency of /healthz probed every 20 ms (a new connection each time) from the agent's
# start until the initial sync is complete. Then the same with every other node behind
# a router (mode=vxlan): each one is reached through the VXLAN overlay, so the initial
# sync also programs an FDB and a neighbour entry per node.
#
# The `cluster-scale ...` lines the test prints go to $BENCH_OUT/cluster.txt (default
# target/bench) and, as figures, to $BENCH_OUT/figures/cluster.tsv: the last size of
# each mode gives the judged figures (`cluster.direct_initial_sync_ms`, ...), earlier
# sizes are recorded with their size in the name (`cluster.direct_500_initial_sync_ms`).
# Exits non-zero when a test fails or a figure misses its target.
#
#   sudo tests/bench/cluster.sh                       # 5,000 nodes, direct and VXLAN
#   sudo BENCH_SMOKE=1 tests/bench/cluster.sh         # 300 nodes each: the smoke run
#   CLUSTER_SIZES="500 5000" CLUSTER_OVERLAY_SIZES="" sudo tests/bench/cluster.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/bench/static-agent.sh
. tests/bench/static-agent.sh
if [[ ${BENCH_SMOKE:-0} != 0 ]]; then
    direct_sizes=${CLUSTER_SIZES:-300}
    overlay_sizes=${CLUSTER_OVERLAY_SIZES-300}
else
    direct_sizes=${CLUSTER_SIZES:-5000}
    overlay_sizes=${CLUSTER_OVERLAY_SIZES-5000}
fi
mkdir -p "$out/figures"
: >"$out/cluster.txt"
: >"$out/figures/cluster.tsv"
failed=0

# measure <test> <sizes...>: the test at each size; its line to cluster.txt, its figures to
# cluster.tsv (the last size's without the size in their names).
measure() {
    local test=$1 n last
    shift
    last=${*: -1}
    for n in "$@"; do
        if ! CNI_RS_SCALE_NODES=$n CNI_NODE_BIN=$PWD/$agent \
            cargo test -p cni-blackbox --test cluster_scale -- --nocapture --exact "$test" \
            >"$out/cluster-$test-$n.out" 2>&1; then
            tail -40 "$out/cluster-$test-$n.out"
            echo "cluster: $test at $n nodes failed (output in $out/cluster-$test-$n.out)" >&2
            failed=1
            continue
        fi
        grep '^cluster-scale ' "$out/cluster-$test-$n.out" | tee -a "$out/cluster.txt" |
            awk -v n="$n" -v judged="$last" '{
                mode = ""; sized = ""
                for (i = 2; i <= NF; i++) {
                    split($i, kv, "=")
                    if (kv[1] == "mode") { mode = kv[2]; continue }
                    if (kv[1] == "nodes" && n != judged) sized = n "_"
                    printf "cluster.%s_%s%s\t%s\n", mode, sized, kv[1], kv[2]
                }
            }' >>"$out/figures/cluster.tsv"
    done
}

# shellcheck disable=SC2086 # sizes are lists of words
measure the_agent_syncs_thousands_of_nodes $direct_sizes
if [[ -n $overlay_sizes ]]; then
    # shellcheck disable=SC2086
    measure the_agent_syncs_thousands_of_encapsulated_nodes $overlay_sizes
fi
write_machine cluster "nodes: direct ${direct_sizes// /, }${overlay_sizes:+; VXLAN ${overlay_sizes// /, }}; 200 additions each"
cp "$out/cluster.txt" "$out/cluster/cluster.txt"
echo "recorded in $out/cluster.txt and $out/figures/cluster.tsv"
judged=0
/usr/bin/python3 tests/bench/judge.py cluster || judged=$?
exit $((failed ? 1 : judged))

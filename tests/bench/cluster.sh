#!/usr/bin/env bash
# Scale benchmark of the node agent (docs/kubernetes.md, "Kubernetes cluster network"): the API
# test server holds N realistic Nodes (~15 KB each) and one cni-node, built as the
# release builds it, syncs them in a throwaway network namespace. Prints, per size:
# initial sync to every route in the kernel, peak RSS, the time from a served
# node change to its route (p50/p99 over 200 additions), and the latency of /healthz
# probed every 20 ms (a new connection each time) from the agent's start until the
# initial sync is complete (healthz_p99_ms, healthz_max_ms; the agent's target is an
# answer within 100 ms at any time). The lines are also written to
# $BENCH_OUT/cluster.txt (default target/bench).
#
# Then the same with every other node behind a router (mode=vxlan): each one is
# reached through the VXLAN overlay, so the initial sync also programs an FDB and a
# neighbour entry per node (sizes in CLUSTER_OVERLAY_SIZES, default 5000; empty for
# none).
#
#   sudo tests/bench/cluster.sh            # 500 and 5000 nodes, then 5000 through VXLAN
#   CLUSTER_SIZES="1000" CLUSTER_OVERLAY_SIZES="" sudo tests/bench/cluster.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/bench/static-agent.sh
. tests/bench/static-agent.sh
: >"$out/cluster.txt"
for n in ${CLUSTER_SIZES:-500 5000}; do
    CNI_RS_SCALE_NODES=$n CNI_NODE_BIN=$PWD/$agent \
        cargo test -p cni-blackbox --test cluster_scale -- --nocapture --exact \
        the_agent_syncs_thousands_of_nodes 2>&1 |
        grep '^cluster-scale ' | tee -a "$out/cluster.txt"
done
for n in ${CLUSTER_OVERLAY_SIZES-5000}; do
    CNI_RS_SCALE_NODES=$n CNI_NODE_BIN=$PWD/$agent \
        cargo test -p cni-blackbox --test cluster_scale -- --nocapture --exact \
        the_agent_syncs_thousands_of_encapsulated_nodes 2>&1 |
        grep '^cluster-scale ' | tee -a "$out/cluster.txt"
done
echo "recorded in $out/cluster.txt"

#!/usr/bin/env bash
# NetworkPolicy benchmark of the node agent (docs/performance.md#networkpolicy): the API
# test server holds a cluster of 100 pods per node over labelled namespaces and
# NetworkPolicies of upstream-like shapes, and one cni-node, built as the release
# builds it, enforces them on one node in a throwaway network namespace. Prints, per
# size: the initial sync to every local pod's entries in the table, peak RSS, the time
# from a served change (a policy added, a pod's label changed, a pod added on the node,
# a namespace's label changed) to the agent's nftables commit (p50/p99/max over the
# changes), and the cost of a new TCP connection between two pods of the node with the
# policies in force next to a node with none (p50/p99, alternating rounds). The lines
# are also written to $BENCH_OUT/network-policy.txt (default target/bench), and the
# agent's debug log, with the time of each step of each pass, to
# $BENCH_OUT/network-policy-<pods>.log (the test's output beside it, .out).
#
#   sudo tests/bench/network-policy.sh                 # 10,000 pods, 1,000 policies
#   POLICY_SIZES="2000:200 10000:1000" sudo tests/bench/network-policy.sh
#   POLICY_CHANGES=200 POLICY_CONNECTIONS=5000         # the defaults
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/bench/static-agent.sh
. tests/bench/static-agent.sh
out=$(cd "$out" && pwd)
: >"$out/network-policy.txt"
for size in ${POLICY_SIZES:-10000:1000}; do
    pods=${size%%:*}
    policies=${size##*:}
    RUST_LOG=warn,cni_node=debug \
        CNI_RS_SCALE_PODS=$pods CNI_RS_SCALE_POLICIES=$policies \
        CNI_RS_SCALE_CHANGES=${POLICY_CHANGES:-200} \
        CNI_RS_SCALE_CONNECTIONS=${POLICY_CONNECTIONS:-5000} \
        CNI_RS_SCALE_AGENT_LOG=$out/network-policy-$pods.log \
        CNI_NODE_BIN=$PWD/$agent \
        cargo test -p cni-blackbox --test policy_scale -- --nocapture \
        >"$out/network-policy-$pods.out" 2>&1 ||
        { tail -40 "$out/network-policy-$pods.out"; exit 1; }
    grep '^policy-scale ' "$out/network-policy-$pods.out" | tee -a "$out/network-policy.txt"
done
echo "recorded in $out/network-policy.txt"

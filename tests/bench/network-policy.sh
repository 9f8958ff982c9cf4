#!/usr/bin/env bash
# NetworkPolicy benchmark of the node agent (docs/performance.md#networkpolicy), judged
# against the [network_policy.*] targets of tests/bench/targets.toml. The API test
# server holds a cluster of 100 pods per node over labelled namespaces and
# NetworkPolicies of upstream-like shapes, and one cni-node, built as the release builds
# it (tests/bench/static-agent.sh), enforces them on one node in a throwaway network
# namespace. Measured per size: the initial sync to every local pod's entries in the
# table, peak RSS, the time from a served change (a policy added, a pod's label changed,
# a pod added on the node, a namespace's label changed) to the agent's nftables commit
# (p50/p99/max over the changes), and the cost of a new TCP connection between two pods
# of the node with the policies in force next to a node with none (p50/p99, alternating
# rounds).
#
# Then the same again at the last size with 100 ClusterNetworkPolicies on top (half
# Admin, half Baseline, up to 25 rules each; POLICY_CLUSTER_POLICIES sets how many, 0
# skips it), whose figures are named `network_policy.cnp_<figure>` and judged against
# the `[network_policy.cnp_*]` targets: what the tiers cost the sync, the memory, a
# change (a fifth kind, an Admin policy added, joins the four) and a new connection.
#
# The last size's NetworkPolicy run also runs the agent with --deny-log and floods it
# with 10,000 denied attempts a second for 10 s (`network_policy.deny_log_*`): its CPU,
# the log's lines a second against its rate, the slowest /healthz meanwhile.
#
# The `policy-scale ...` lines go to $BENCH_OUT/network-policy.txt (default
# target/bench) and, as figures, to $BENCH_OUT/figures/network_policy.tsv: the last size
# gives the judged figures (`network_policy.initial_sync_ms`, ...), earlier sizes are
# recorded with their number of pods in the name. The agent's debug log, with the time
# of each step of each pass, is kept in $BENCH_OUT/network-policy-<pods>.log (<pods>-cnp.log
# for the ClusterNetworkPolicy run; the test's
# output beside it, .out). Exits non-zero when the test fails or a figure misses its
# target.
#
#   sudo tests/bench/network-policy.sh                 # 10,000 pods, 1,000 policies
#   sudo BENCH_SMOKE=1 tests/bench/network-policy.sh   # 1,000 pods, 100 policies
#   POLICY_SIZES="2000:200 10000:1000" sudo tests/bench/network-policy.sh
#   POLICY_CHANGES=200 POLICY_CONNECTIONS=20000        # the full run's defaults
#   POLICY_CLUSTER_POLICIES=0                          # without the ClusterNetworkPolicy run
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/bench/static-agent.sh
. tests/bench/static-agent.sh
out=$(cd "$out" && pwd)
if [[ ${BENCH_SMOKE:-0} != 0 ]]; then
    sizes=${POLICY_SIZES:-1000:100} changes=${POLICY_CHANGES:-100} connections=${POLICY_CONNECTIONS:-2000}
else
    sizes=${POLICY_SIZES:-10000:1000} changes=${POLICY_CHANGES:-200} connections=${POLICY_CONNECTIONS:-20000}
fi
mkdir -p "$out/figures"
: >"$out/network-policy.txt"
: >"$out/figures/network_policy.tsv"
cluster_policies=${POLICY_CLUSTER_POLICIES:-100}
failed=0
last=${sizes##* }
# pods:policies:cluster policies, and the prefix of its figures' names.
runs=()
for size in $sizes; do
    prefix=${size%%:*}_
    [[ $size == "$last" ]] && prefix=
    runs+=("$size:0:$prefix")
done
[[ $cluster_policies != 0 ]] && runs+=("$last:$cluster_policies:cnp_")
for spec in "${runs[@]}"; do
    IFS=: read -r pods policies cnps prefix <<<"$spec"
    name=$pods
    [[ $cnps != 0 ]] && name+=-cnp
    # The deny log's flood runs with the last size's NetworkPolicy run.
    deny_log=0
    [[ $cnps == 0 && $pods:$policies == "$last" ]] && deny_log=1
    if ! RUST_LOG=warn,cni_node=debug \
        CNI_RS_SCALE_PODS=$pods CNI_RS_SCALE_POLICIES=$policies \
        CNI_RS_SCALE_CLUSTER_POLICIES=$cnps CNI_RS_SCALE_DENY_LOG=$deny_log \
        CNI_RS_SCALE_CHANGES=$changes CNI_RS_SCALE_CONNECTIONS=$connections \
        CNI_RS_SCALE_AGENT_LOG=$out/network-policy-$name.log \
        CNI_NODE_BIN=$PWD/$agent \
        cargo test -p cni-blackbox --test policy_scale -- --nocapture \
        >"$out/network-policy-$name.out" 2>&1; then
        tail -40 "$out/network-policy-$name.out"
        echo "network-policy: $pods:$policies with $cnps cluster policies failed (output in $out/network-policy-$name.out)" >&2
        failed=1
        continue
    fi
    grep '^policy-scale ' "$out/network-policy-$name.out" | tee -a "$out/network-policy.txt" |
        awk -v prefix="$prefix" '{
            for (i = 2; i <= NF; i++) {
                split($i, kv, "=")
                printf "network_policy.%s%s\t%s\n", prefix, kv[1], kv[2]
            }
        }' >>"$out/figures/network_policy.tsv"
done
write_machine network_policy "pods:policies ${sizes// /, }; $changes changes; $connections connections per setup; $cluster_policies ClusterNetworkPolicies at $last"
cp "$out/network-policy.txt" "$out/network_policy/network-policy.txt"
echo "recorded in $out/network-policy.txt and $out/figures/network_policy.tsv"
judged=0
/usr/bin/python3 tests/bench/judge.py network_policy || judged=$?
exit $((failed ? 1 : judged))

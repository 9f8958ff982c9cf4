#!/usr/bin/env bash
# Churn soak of the node agent (docs/kubernetes.md, "Kubernetes cluster network"), judged
# against the [agent_soak.*] targets of tests/bench/targets.toml. Runs
# tests/tests/agent_soak.rs with cni-node built as the release builds it
# (tests/bench/static-agent.sh): the API test server holds a small cluster and the
# test changes it without pause for SOAK_SECONDS (pods added, relabelled and deleted on
# the agent's node and on others, NetworkPolicies added and deleted, namespaces'
# labels flipped, nodes added and deleted), sampling the agent's RSS, open files,
# threads, table sizes, routes and gauges; at six checkpoints it deletes every churned
# object and waits for the agent's state to equal the baseline of the same cluster.
#
# The `agent-soak ...` line goes to $BENCH_OUT/agent-soak.txt (default target/bench)
# and, as figures, to $BENCH_OUT/figures/agent_soak.tsv; the agent's log to
# $BENCH_OUT/agent-soak.log, its samples (RSS, open files, threads, table elements,
# routes) to agent-soak-samples.tsv, the test's output to agent-soak.out. Exits non-zero when
# the test fails (a checkpoint that did not come back, an entry left for an object that
# is gone) or a figure misses its target.
#
#   sudo tests/bench/agent-soak.sh                    # an hour of churn
#   sudo BENCH_SMOKE=1 tests/bench/agent-soak.sh      # two minutes
#   SOAK_SECONDS=300 sudo tests/bench/agent-soak.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=tests/bench/static-agent.sh
. tests/bench/static-agent.sh
out=$(cd "$out" && pwd)
if [[ ${BENCH_SMOKE:-0} != 0 ]]; then
    seconds=${SOAK_SECONDS:-120}
else
    seconds=${SOAK_SECONDS:-3600}
fi
mkdir -p "$out/figures"
: >"$out/agent-soak.txt"
: >"$out/figures/agent_soak.tsv"
echo "agent-soak: ${seconds} s of churn"
failed=0
if ! CNI_RS_SOAK_SECONDS=$seconds CNI_RS_SOAK_AGENT_LOG=$out/agent-soak.log \
    CNI_RS_SOAK_SAMPLES=$out/agent-soak-samples.tsv \
    CNI_NODE_BIN=$PWD/$agent \
    cargo test -p cni-blackbox --test agent_soak -- --nocapture \
    >"$out/agent-soak.out" 2>&1; then
    tail -60 "$out/agent-soak.out"
    echo "agent-soak: the test failed (output in $out/agent-soak.out)" >&2
    failed=1
fi
grep '^agent-soak ' "$out/agent-soak.out" | tee -a "$out/agent-soak.txt" |
    awk '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); printf "agent_soak.%s\t%s\n", kv[1], kv[2] } }' \
        >>"$out/figures/agent_soak.tsv"
write_machine agent_soak "$seconds s of churn"
cp "$out/agent-soak.txt" "$out/agent_soak/agent-soak.txt"
[[ -f $out/agent-soak-samples.tsv ]] && cp "$out/agent-soak-samples.tsv" "$out/agent_soak/samples.tsv"
echo "recorded in $out/agent-soak.txt and $out/figures/agent_soak.tsv"
judged=0
/usr/bin/python3 tests/bench/judge.py agent_soak || judged=$?
exit $((failed ? 1 : judged))

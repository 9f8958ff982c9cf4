#!/usr/bin/env bash
# Benchmark: the node agent's documented reactions (docs/kubernetes.md, "Kubernetes
# cluster network"), each measured many times and judged against the docs' figures:
#
#   readyz_recovery   /readyz is 200 again within 5 s of a failed step's cause going
#                     away (the retry alone: no event, no notification, no resync)
#   mtu_to_conflist   an uplink MTU change is in the conflist within 1 s
#   route_back        a route of the agent's deleted by hand is back within 1 s
#   renumbered_watch  a renumbered node follows the API again within 3 s of its old
#                     address going (its watches ended and made again from the new one)
#
# It runs the cluster tests that measure them (tests/tests/cluster_agent.rs, agents at
# --resync-interval 3600, in throwaway network namespaces) one at a time, with
# CNI_RS_CONTRACT_SAMPLES samples each (20; 5 with BENCH_SMOKE=1; CONTRACT_SAMPLES
# overrides), and writes the median and the maximum of each to
# $BENCH_OUT/figures/contracts.tsv (BENCH_OUT defaults to target/bench), then judges them
# with tests/bench/judge.py contracts against [contracts.*] in tests/bench/targets.toml
# and exits with its status. The maxima are judged (the contract holds for every
# sample); the medians are recorded.
#
# The build is the test profile's (debug): what is measured is how soon the agent
# reacts to an event, which waits on wake-ups, retries and the API client's backoff, not
# on CPU. The tests' own assertions are generous ("it happened"); the contract is
# checked here. Run as root:
#
#   tests/bench/contracts.sh                  # full run, about 3 minutes
#   BENCH_SMOKE=1 tests/bench/contracts.sh    # smoke run, about a minute once built
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

[[ $(id -u) -eq 0 ]] || { echo "error: run as root (network namespaces)" >&2; exit 1; }

smoke=0
[[ ${BENCH_SMOKE:-0} != 0 && -n ${BENCH_SMOKE:-} ]] && smoke=1
samples=${CONTRACT_SAMPLES:-$([[ $smoke == 1 ]] && echo 5 || echo 20)}
out=${BENCH_OUT:-target/bench}
mkdir -p "$out/figures"
figures=$out/figures/contracts.tsv
: >"$figures"
measured=$(mktemp)
trap 'rm -f "$measured"' EXIT

# The tests, by the names that say which path they prove (cluster_agent.rs), and the
# figure each records (its `contract: ...` name) under the short name used here.
tests=(
    readyz_is_503_naming_the_failed_step_and_ready_through_the_retry_once_the_cause_is_gone
    link_notification_an_uplink_mtu_change_reaches_the_conflist
    route_notification_a_route_deleted_by_hand_is_back_in_both_families
    address_notification_a_watch_that_died_with_the_nodes_old_address_is_replaced
)

echo "contracts: $samples samples each ($([[ $smoke == 1 ]] && echo smoke || echo full) run, debug build)"
started=$(date +%s)
load0=$(cut -d' ' -f1 /proc/loadavg)
cargo test --quiet --no-run -p cni-blackbox --test cluster_agent
CNI_RS_CONTRACT_SAMPLES=$samples CNI_RS_MEASURED=$measured \
    cargo test --quiet -p cni-blackbox --test cluster_agent -- --exact "${tests[@]}" \
    --test-threads=1

/usr/bin/python3 - "$measured" "$figures" <<'EOF'
import statistics
import sys

measured, figures = sys.argv[1], sys.argv[2]
short = {
    "contract: /readyz 200 after a failed step's cause is gone": "readyz_recovery",
    "contract: uplink MTU change in the conflist": "mtu_to_conflist",
    "contract: route of the agent's deleted by hand, back": "route_back",
    "contract: renumbered node's watches follow the API again after the old address went":
        "renumbered_watch",
}
samples = {name: [] for name in short.values()}
with open(measured, encoding="utf-8") as f:
    for line in f:
        parts = line.rstrip("\n").split("\t")
        if len(parts) == 4 and parts[1] in short and parts[3] == "ms":
            samples[short[parts[1]]].append(float(parts[2]))
with open(figures, "w", encoding="utf-8") as f:
    for name, values in samples.items():
        if not values:
            print(f"contracts: no sample of {name}", file=sys.stderr)
            continue
        print(f"{name}: {len(values)} samples, ms: " + " ".join(f"{v:.0f}" for v in values))
        f.write(f"contracts.{name}_p50_ms\t{statistics.median(values):.1f}\n")
        f.write(f"contracts.{name}_max_ms\t{max(values):.1f}\n")
EOF
echo "contracts: measured in $(( $(date +%s) - started )) s"
# The run's circumstances, which tests/bench/write-docs.py puts beside the recorded figures.
mkdir -p "$out/contracts"
{
    echo "run: $([[ $smoke == 1 ]] && echo smoke || echo full)"
    echo "date: $(date -u -d "@$started" '+%Y-%m-%d %H:%M UTC')"
    echo "machine: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)"
    commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
    [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]] && commit+="+changes"
    echo "commit: $commit"
    echo "load: $load0 at the start, $(cut -d' ' -f1 /proc/loadavg) at the end"
    echo "duration: $(($(date +%s) - started)) s"
    echo "scale: $samples samples of each reaction, debug build"
} >"$out/contracts/machine.txt"
exec /usr/bin/python3 tests/bench/judge.py contracts

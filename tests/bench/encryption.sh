#!/usr/bin/env bash
# The cost of the node agent's WireGuard encryption (docs/performance.md,
# "Encryption"), judged against the [encryption.*] targets of tests/bench/targets.toml.
# This machine's kernel has no WireGuard, so it boots Debian's stock kernel under
# emulation, as the stock-kernel tier does (tests/vm/lib.sh), and runs
# tests/tests/encryption_scale.rs inside it with the static release agent
# (tests/bench/static-agent.sh):
#   - N realistic Nodes behind a router synced by one agent through VXLAN (FDB,
#     neighbour and route per node), then the same Nodes with WireGuard keys synced by a
#     fresh agent with `--encryption wireguard` (a peer and a route per node): both times
#     from the agent's start to its last route, and their ratio (`sync_ratio`); the
#     agent's peak RSS with the keyed peers, across the key changes that follow;
#   - one node's key changed at a time on the API server, until the device shows the new
#     peer (read back-to-back over generic netlink), timed to the return of the kernel's
#     last write before the read that showed it (a kprobe on wg_set_device): p50, p99;
#     the same timed by that read (late by up to one read of all the peers,
#     `device_read_p50_ms`) recorded beside them;
#   - one TCP stream between two pods on two nodes through VXLAN, then, the agents
#     restarted with encryption, through WireGuard (emulated: the figures say how the
#     two compare here, not what hardware does).
# Full run: 5,000 nodes, two syncs in each mode alternating (each mode's time is the
# faster of its two: the first agent of a boot pays for what comes first), 100 key
# changes, 3 s streams; BENCH_SMOKE=1: 300 nodes, the same two syncs of each, 20 key
# changes, 2 s. The `encryption-...` lines go to
# $BENCH_OUT/encryption.txt (default target/bench) and as figures to
# $BENCH_OUT/figures/encryption.tsv; the guest's log and the agents' to
# $BENCH_OUT/encryption/. Exits non-zero when the guest or a test fails or a figure
# misses its target.
#
#   sudo CNI_RS_VM_CACHE=/var/cache/cni-vm tests/bench/encryption.sh
#   sudo BENCH_SMOKE=1 tests/bench/encryption.sh
# Environment: ENCRYPTION_NODES, ENCRYPTION_ROUNDS, ENCRYPTION_KEY_CHANGES,
# ENCRYPTION_TRAFFIC_SECS (the scale), ENCRYPTION_TIMEOUT (seconds for the guest;
# default 600, 2400 in a full run), CNI_RS_VM_CACHE and the rest of tests/vm/lib.sh's;
# CNI_RS_SKIP_VM=1 (a developer's shortcut, as for tests/run-all.sh) skips it, exit 0.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
if [[ ${CNI_RS_SKIP_VM:-} == 1 ]]; then
    # The developer's shortcut that skips the stock-kernel tier (CI never sets it).
    echo "encryption: NOT RUN: CNI_RS_SKIP_VM=1 skips the stock-kernel VM it needs" >&2
    exit 0
fi
# shellcheck source=tests/bench/static-agent.sh
. tests/bench/static-agent.sh
# shellcheck source=tests/vm/lib.sh
. tests/vm/lib.sh
vm_label="encryption"
if [[ $run == smoke ]]; then
    nodes=${ENCRYPTION_NODES:-300} rounds=${ENCRYPTION_ROUNDS:-2}
    changes=${ENCRYPTION_KEY_CHANGES:-20}
    secs=${ENCRYPTION_TRAFFIC_SECS:-2} timeout_s=${ENCRYPTION_TIMEOUT:-600}
else
    nodes=${ENCRYPTION_NODES:-5000} rounds=${ENCRYPTION_ROUNDS:-2}
    changes=${ENCRYPTION_KEY_CHANGES:-100}
    secs=${ENCRYPTION_TRAFFIC_SECS:-3} timeout_s=${ENCRYPTION_TIMEOUT:-2400}
fi
mkdir -p "$out/figures" "$out/encryption"
: >"$out/encryption.txt"
: >"$out/figures/encryption.tsv"

vm_prepare

# The full run's test binary is optimized: it holds the API test server and reads the
# device for each key change, so a debug build would add its own slowness to the figure
# (at 5,000 peers a read took 75 ms against 26 ms optimized). The smoke run keeps the
# debug build the suite already has, to spare CI a second build of the dependencies.
test_profile=()
[[ $run == full ]] && test_profile=(--release)
vm_step "cargo build: plugins, cnitool and the test binary ${test_profile[*]}"
plugins=$(cargo build -q --bins -p cni-plugins -p cnitool \
    --message-format=json-render-diagnostics | cargo_executables)
tests=$(cargo test -q "${test_profile[@]}" --no-run -p cni-blackbox --test encryption_scale \
    --message-format=json-render-diagnostics | cargo_executables)
multicall=$(awk '$1 == "cni-plugins-rs" {print $2}' <<<"$plugins")
cnitool=$(awk '$1 == "cnitool" {print $2}' <<<"$plugins")
test_bin=$(awk '$1 == "encryption_scale" {print $2}' <<<"$tests")
for exe in "$multicall" "$cnitool" "$test_bin"; do
    [[ -x $exe ]] || vm_die "cargo did not report the executables (cni-plugins-rs=$multicall \
cnitool=$cnitool encryption_scale=$test_bin)"
done

# Stripped copies (every byte crosses 9p under emulation); the plugins are hard links of
# the one multi-call binary, as shipped; the agent is the static release build.
stage=$(mktemp -d /tmp/cni-encryption-bench.XXXXXX)
trap 'rm -rf "$stage"' EXIT
vm_stage_bin "$stage" "$multicall" "$cnitool" "$agent"
strip -o "$stage/encryption_scale" "$test_bin"

vm_start=$(date +%s)
vm_boot "$timeout_s" "$stage" "$root/tests/vm/encryption-guest.sh $stage $nodes $rounds $changes $secs"
vm_end=$(date +%s)
cp "$stage"/*.log "$out/encryption/" 2>/dev/null || true
vm_step "guest log"
cat "$stage/tests.log" 2>/dev/null || true
[[ -f $stage/boot-seconds ]] && boot="$(cat "$stage/boot-seconds") s" || boot="?"
printf '\n[encryption] guest uptime at first command: %s; VM run %d s\n' \
    "$boot" "$((vm_end - vm_start))"

failed=0
if [[ ! -f $stage/rc ]]; then
    case $vng_rc in
        124) echo "encryption: the guest ran past ${timeout_s} s (ENCRYPTION_TIMEOUT) and was killed" >&2 ;;
        *) echo "encryption: the guest died before the tests finished (vng exit $vng_rc)" >&2 ;;
    esac
    failed=1
elif [[ $(cat "$stage/rc") -ne 0 ]]; then
    echo "encryption: a test failed in the guest (log in $out/encryption/tests.log)" >&2
    failed=1
fi
# encryption-scale nodes=5000 vxlan_sync_ms=812 ... as encryption.vxlan_sync_ms<TAB>812;
# the scale (nodes, rounds, key_changes, secs) is in machine.txt, not a figure.
cp "$stage/encryption.txt" "$out/encryption.txt" 2>/dev/null || true
awk '{ for (i = 2; i <= NF; i++) { split($i, kv, "=")
         if (kv[1] != "nodes" && kv[1] != "rounds" && kv[1] != "key_changes" && kv[1] != "secs")
             printf "encryption.%s\t%s\n", kv[1], kv[2] } }' \
    "$out/encryption.txt" >"$out/figures/encryption.tsv"
cat "$out/encryption.txt"
write_machine encryption "$nodes nodes, $rounds round(s) of each sync, $changes key changes, ${secs} s TCP streams; Debian's stock kernel $(basename "$kernel" | sed 's/^vmlinuz-//') under QEMU emulation (TCG, 2 vCPUs, 2 GiB); VM run $((vm_end - vm_start)) s"
echo "recorded in $out/encryption.txt and $out/figures/encryption.tsv"
judged=0
/usr/bin/python3 tests/bench/judge.py encryption || judged=$?
exit $((failed ? 1 : judged))

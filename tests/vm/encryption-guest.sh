#!/bin/sh
# Inside the stock-kernel guest booted by tests/bench/encryption.sh (not meant to be run
# by hand):
#   encryption-guest.sh OUT NODES ROUNDS KEY_CHANGES TRAFFIC_SECS
# OUT holds the staged binaries (bin/{bridge,host-local,loopback,portmap,bandwidth,
# cnitool,cni-node}, encryption_scale) and is the only directory written back to the
# host: tests.log, boot-seconds, encryption.txt (the tests' `encryption-...` lines), the
# scale test's agent logs (agent-vxlan.log, agent-wireguard.log) and rc (0 when both
# tests passed; its absence tells the host the guest died).
set -u
out=$1
export CNI_RS_SCALE_NODES="$2" CNI_RS_SCALE_ROUNDS="$3" CNI_RS_KEY_CHANGES="$4" \
    ENCRYPTION_TRAFFIC_SECS="$5"

cut -d' ' -f1 /proc/uptime > "$out/boot-seconds"

# Binaries read over 9p start far slower under emulation: run them from tmpfs.
work=/run/cni-encryption-bench
mkdir -p "$work" && cp -r --preserve=links "$out/bin" "$out/encryption_scale" "$work/" || exit 1

export CNI_BLACKBOX_BIN_DIR="$work/bin" CNI_NODE_BIN="$work/bin/cni-node" \
    CNI_RS_REQUIRE_WIREGUARD=1 RUST_BACKTRACE=1 ENCRYPTION_AGENT_LOGS="$out"

# shellcheck source=tests/vm/guest-lib.sh
. "$(dirname "$0")/guest-lib.sh"

{
    echo "kernel: $(uname -r)"
    load_node_modules
    failed=0
    for t in keyed_peers_sync_against_vxlan tcp_through_wireguard_and_vxlan; do
        t0=$(uptime_s)
        if "$work/encryption_scale" --ignored --exact "$t" --nocapture --test-threads=1; then
            verdict=ok
        else
            verdict=FAILED failed=$((failed + 1))
        fi
        echo "[guest] $t: $verdict in $(since_s "$t0") s"
    done
    [ "$failed" -eq 0 ] && echo 0 > "$out/rc" || echo 1 > "$out/rc"
} > "$out/tests.log" 2>&1
# A test's own output follows `test <name> ... ` on its line.
grep -oE 'encryption-(scale|traffic) .*' "$out/tests.log" > "$out/encryption.txt"
exit "$(cat "$out/rc")"

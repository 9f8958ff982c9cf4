#!/bin/sh
# Inside the stock-kernel guest booted by run-vlan-tier.sh (not meant to be run by hand):
#   vlan-tier-guest.sh OUT CI=<value>
# OUT holds the staged binaries (bin/{bridge,host-local,loopback,portmap,bandwidth,cnitool,
# cni-node}, bridge_vlan, cluster_wireguard, netlink, wireguard)
# and is the only directory written back to the host: tests.log, boot-seconds, measured
# (the figures the tests measured, cni_blackbox::measured), and rc (the tests' exit
# status; its absence tells the host the guest died).
set -u
out=$1
export CI="${2#CI=}"

cut -d' ' -f1 /proc/uptime > "$out/boot-seconds"

# Binaries read over 9p start far slower under emulation: run them from tmpfs.
work=/run/cni-vlan-tier
mkdir -p "$work" && cp -r --preserve=links "$out/bin" "$out/bridge_vlan" "$out/cluster_wireguard" \
    "$out/netlink" "$out/wireguard" "$work/" || exit 1

export CNI_BLACKBOX_BIN_DIR="$work/bin" CNI_RS_REQUIRE_VLAN=1 CNI_RS_REQUIRE_WIREGUARD=1 \
    CNI_RS_MEASURED="$out/measured" RUST_BACKTRACE=1

# shellcheck source=tests/vm/guest-lib.sh
. "$(dirname "$0")/guest-lib.sh"

# Runs the tests of binary $1 whose names contain $2, one process per test, so that the
# log shows each test's duration under emulation.
run_tests() {
    names=$("$work/$1" --list "$2" | sed -n 's/: test$//p')
    if [ -z "$names" ]; then
        echo "no test of $1 matches '$2'"
        failed=$((failed + 1))
        return
    fi
    for t in $names; do
        t0=$(uptime_s)
        if "$work/$1" --exact "$t" --test-threads=1; then
            passed=$((passed + 1)); verdict=ok
        else
            failed=$((failed + 1)); verdict=FAILED
        fi
        echo "[guest] $1 $t: $verdict in $(since_s "$t0") s"
    done
}

{
    echo "kernel: $(uname -r)"
    passed=0 failed=0
    run_tests bridge_vlan ""
    # The netlink crate's VLAN tests (in-process, cheap).
    run_tests netlink vlan
    # WireGuard's netlink calls and a tunnel between two namespaces (in-process but
    # for a few pings).
    run_tests wireguard ""
    load_node_modules
    # Three encrypting agents, pods on each, a capture on the underlay; then the faults.
    run_tests cluster_wireguard encrypted_pod_traffic
    echo "[guest] stock-kernel tier: $passed passed, $failed failed"
    [ "$failed" -eq 0 ] && echo 0 > "$out/rc" || echo 1 > "$out/rc"
} > "$out/tests.log" 2>&1
exit "$(cat "$out/rc")"

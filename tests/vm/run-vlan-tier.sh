#!/usr/bin/env bash
# Stock-kernel tier: the bridge VLAN and WireGuard tests on Debian's own kernel
# (docs/testing.md).
# Run as root on Debian 12:  tests/vm/run-vlan-tier.sh      (tests/run-all.sh calls it)
#
# The development and CI machines run a kernel without bridge VLAN filtering and without
# WireGuard, so the `vlan`, `vlanTrunk` and `preserveDefaultVlan` keys and the agent's
# encryption can only be observed elsewhere. This script boots Debian's stock kernel
# with virtme-ng under pure emulation (`vng --disable-kvm`: this machine's KVM cannot
# boot a stock kernel), with the host's files visible read-only and one directory
# shared read-write for the logs, and runs inside it, in one boot, only the tests that
# need that kernel, built here beforehand:
#   - tests/tests/bridge_vlan.rs (the plugin binaries: port VLANs, traffic, DEL);
#   - the `vlan` tests of crates/cni-linux/tests/netlink.rs (the netlink calls);
#   - crates/cni-linux/tests/wireguard.rs (WireGuard devices, peers, a tunnel);
#   - tests/tests/cluster_wireguard.rs (three `cni-node --encryption wireguard` agents:
#     pod to pod across every pair, only WireGuard on the underlay; then quiet agents,
#     a SIGKILL and restart and a key rotation under a 10 ms ping, a node deleted).
# CNI_RS_REQUIRE_VLAN=1 and CNI_RS_REQUIRE_WIREGUARD=1 in the guest make a kernel
# without VLAN filtering or WireGuard a failure.
# Exit status: the tests' (0 = all passed); 1 for a setup or guest failure.
#
# The preparation and the boot are tests/vm/lib.sh's (shared with the WireGuard
# benchmark, tests/bench/encryption.sh). Nothing is installed into /boot or
# /lib/modules and no bootloader or initramfs hook runs: the kernel package that linux-image-amd64 points at is downloaded
# (`apt-get download`) and unpacked (`dpkg-deb -x`) into the cache directory, and booted
# from there with its modules beside it; virtme-ng goes into a venv in the same cache. A
# second run reuses both. The cache is $CNI_RS_VM_CACHE, else
# $XDG_CACHE_HOME/cni-plugins-rs/vm, else target/vm-cache in the repository.
#
# Measured facts behind the choices: boot takes
# 25-40 s, process starts are 20-60x slower than native, so binaries are copied into the
# guest's tmpfs and the tests run one at a time; vng's output is piped through `cat`
# (QEMU reopens stdout/stderr, a redirect to a file scrambles them).
#
# Environment: VLAN_TIER_TIMEOUT (seconds for the guest, default 900), CNI_RS_VM_CACHE
# (see above), VNG_VENV (where virtme-ng is installed, default <cache>/vng), VNG_VERSION
# (default 1.42), CNI_RS_MEASURED (a file the figures the guest's tests measured are
# appended to, as `cargo test` appends them; they are printed either way).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD

# shellcheck source=tests/vm/lib.sh
. tests/vm/lib.sh
vm_label="vlan tier"
step() { vm_step "$@"; }
die() { vm_die "$@"; }

tier_start=$(date +%s)
timeout_s=${VLAN_TIER_TIMEOUT:-900}

# --- what the tier needs: QEMU, virtme-ng (PyPI, in its own venv), Debian's kernel ---
vm_prepare

# --- build on the host: the plugins and the two test binaries ---
if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi
command -v cargo >/dev/null || die "cargo not found"

step "cargo build: plugins, cnitool, cni-node and test binaries"
build_start=$(date +%s)
plugins=$(cargo build -q --bins -p cni-plugins -p cnitool -p cni-node \
    --message-format=json-render-diagnostics | cargo_executables)
tests=$(cargo test -q --no-run -p cni-blackbox --test bridge_vlan --test cluster_wireguard \
    --message-format=json-render-diagnostics | cargo_executables)
netlink_tests=$(cargo test -q --no-run -p cni-linux --test netlink --test wireguard \
    --message-format=json-render-diagnostics | cargo_executables)
multicall=$(awk '$1 == "cni-plugins-rs" {print $2}' <<<"$plugins")
cnitool=$(awk '$1 == "cnitool" {print $2}' <<<"$plugins")
agent=$(awk '$1 == "cni-node" {print $2}' <<<"$plugins")
vlan_test=$(awk '$1 == "bridge_vlan" {print $2}' <<<"$tests")
cluster_test=$(awk '$1 == "cluster_wireguard" {print $2}' <<<"$tests")
netlink_test=$(awk '$1 == "netlink" {print $2}' <<<"$netlink_tests")
wireguard_test=$(awk '$1 == "wireguard" {print $2}' <<<"$netlink_tests")
for exe in "$multicall" "$cnitool" "$agent" "$vlan_test" "$cluster_test" "$netlink_test" \
    "$wireguard_test"; do
    [[ -x $exe ]] || die "cargo did not report the executables (cni-plugins-rs=$multicall \
cnitool=$cnitool cni-node=$agent bridge_vlan=$vlan_test cluster_wireguard=$cluster_test \
netlink=$netlink_test wireguard=$wireguard_test)"
done
bin_dir=$(dirname "$multicall")
echo "built in $(($(date +%s) - build_start)) s: $bin_dir, $vlan_test, $cluster_test, $netlink_test, $wireguard_test"

# --- stage: stripped copies (debug builds are ~50 MB, mostly debug info, and every
# byte crosses 9p under emulation); the plugins are hard links of the one multi-call
# binary, as shipped; the guest copies them into its tmpfs ---
out=$(mktemp -d /tmp/cni-vlan-tier.XXXXXX)
trap 'rm -rf "$out"' EXIT
vm_stage_bin "$out" "$multicall" "$cnitool" "$agent"
strip -o "$out/bridge_vlan" "$vlan_test"
strip -o "$out/cluster_wireguard" "$cluster_test"
strip -o "$out/netlink" "$netlink_test"
strip -o "$out/wireguard" "$wireguard_test"

guest_cmd="$root/tests/vm/vlan-tier-guest.sh $out CI=${CI:-}"
vm_start=$(date +%s)
vm_boot "$timeout_s" "$out" "$guest_cmd"
vm_end=$(date +%s)

for log in "$out"/*.log; do
    [[ -e $log ]] || continue
    step "guest log: $(basename "$log")"
    cat "$log"
done
if [[ -s $out/measured ]]; then
    step "figures measured in the guest (test binary, what, value, unit)"
    awk -F'\t' '{ printf "%-28s %s: %s %s\n", $1, $2, $3, $4 }' "$out/measured"
    [[ -z ${CNI_RS_MEASURED:-} ]] || cat "$out/measured" >>"$CNI_RS_MEASURED"
fi
[[ -f $out/boot-seconds ]] && boot="$(cat "$out/boot-seconds") s" || boot="?"
printf '\n[vlan tier] guest uptime at first command: %s; VM run %d s; whole tier %d s\n' \
    "$boot" "$((vm_end - vm_start))" "$(($(date +%s) - tier_start))"

if [[ ! -f $out/rc ]]; then
    case $vng_rc in
        124) die "the guest ran past ${timeout_s} s (VLAN_TIER_TIMEOUT) and was killed" ;;
        *) die "the guest died before the tests finished (vng exit $vng_rc)" ;;
    esac
fi
rc=$(cat "$out/rc")
if [[ $rc -ne 0 ]]; then
    echo "[vlan tier] FAILED: the VLAN or WireGuard tests failed in the stock kernel (exit $rc)" >&2
    exit "$rc"
fi
echo "[vlan tier] passed"

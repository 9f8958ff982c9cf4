#!/usr/bin/env bash
# Stock-kernel tier: the bridge VLAN tests on Debian's own kernel (README "Testing").
# Run as root on Debian 12:  tests/vm/run-vlan-tier.sh      (tests/run-all.sh calls it)
#
# The development and CI machines run a kernel without bridge VLAN filtering, so the
# `vlan`, `vlanTrunk` and `preserveDefaultVlan` keys can only be observed elsewhere. This
# script boots Debian's `linux-image-amd64` kernel with virtme-ng under pure emulation
# (`vng --disable-kvm`: this machine's KVM cannot boot a stock kernel), with the host's
# files visible read-only and one directory shared read-write for the logs, and runs
# inside it only the tests that need VLAN filtering, built here beforehand:
#   - tests/tests/bridge_vlan.rs (the plugin binaries: port VLANs, traffic, DEL);
#   - the `vlan` tests of crates/cni-linux/tests/netlink.rs (the netlink calls).
# CNI_RS_REQUIRE_VLAN=1 in the guest makes a kernel without VLAN filtering a failure.
# Exit status: the tests' (0 = all passed); 1 for a setup or guest failure.
#
# Measured facts behind the choices: boot takes
# 25-40 s, process starts are 20-60x slower than native, so binaries are copied into the
# guest's tmpfs and the tests run one at a time; vng's output is piped through `cat`
# (QEMU reopens stdout/stderr, a redirect to a file scrambles them).
#
# Environment: VLAN_TIER_TIMEOUT (seconds for the guest, default 900), VNG_VENV (where
# virtme-ng is installed, default /opt/cni-rs-vng), VNG_VERSION (default 1.42).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD

step() { printf '\n==> [vlan tier] %s\n' "$*"; }
die() { echo "error: [vlan tier] $*" >&2; exit 1; }

tier_start=$(date +%s)
timeout_s=${VLAN_TIER_TIMEOUT:-900}
venv=${VNG_VENV:-/opt/cni-rs-vng}
vng_version=${VNG_VERSION:-1.42}

# --- what the tier needs: QEMU, Debian's kernel, virtme-ng (PyPI, in its own venv) ---
# Debian's python3 (not a pyenv one that may come first in PATH) builds the venv, so the
# venv outlives changes to the user's Python setup; pip into a venv needs no
# --break-system-packages.
packages=(qemu-system-x86 linux-image-amd64 python3-venv binutils iproute2 iputils-ping)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    [[ $(id -u) -eq 0 ]] || die "missing packages (${missing[*]}) and not root"
    step "apt-get install ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q \
        --no-install-recommends "${missing[@]}"
fi
if ! "$venv/bin/vng" --version 2>/dev/null | grep -qx "virtme-ng $vng_version"; then
    step "pip install virtme-ng==$vng_version into $venv"
    [[ -x $venv/bin/pip ]] || /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q "virtme-ng==$vng_version"
fi
# vng starts its helpers (virtme-run) from PATH.
export PATH="$venv/bin:$PATH"

kernel=$(find /boot -maxdepth 1 -name 'vmlinuz-*-amd64' | sort -V | tail -n 1)
[[ -n $kernel ]] || die "no /boot/vmlinuz-*-amd64 (is linux-image-amd64 installed?)"
[[ -d /lib/modules/${kernel#/boot/vmlinuz-} ]] || die "no modules for $kernel"

# --- build on the host: the plugins and the two test binaries ---
if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi
command -v cargo >/dev/null || die "cargo not found"

# Paths of the executables cargo reports in its JSON messages (one per line).
executables() {
    /usr/bin/python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], m["executable"])
'
}

step "cargo build: plugins and test binaries"
build_start=$(date +%s)
plugins=$(cargo build -q --bins -p cni-plugins \
    --message-format=json-render-diagnostics | executables)
tests=$(cargo test -q --no-run -p cni-blackbox --test bridge_vlan \
    --message-format=json-render-diagnostics | executables)
netlink_tests=$(cargo test -q --no-run -p cni-linux --test netlink \
    --message-format=json-render-diagnostics | executables)
multicall=$(awk '$1 == "cni-plugins-rs" {print $2}' <<<"$plugins")
vlan_test=$(awk '$1 == "bridge_vlan" {print $2}' <<<"$tests")
netlink_test=$(awk '$1 == "netlink" {print $2}' <<<"$netlink_tests")
[[ -x $multicall && -x $vlan_test && -x $netlink_test ]] ||
    die "cargo did not report the executables (cni-plugins-rs=$multicall bridge_vlan=$vlan_test netlink=$netlink_test)"
bin_dir=$(dirname "$multicall")
echo "built in $(($(date +%s) - build_start)) s: $bin_dir, $vlan_test, $netlink_test"

# --- stage: stripped copies (debug builds are ~50 MB, mostly debug info, and every
# byte crosses 9p under emulation); the plugins are hard links of the one multi-call
# binary, as shipped; the guest copies them into its tmpfs ---
out=$(mktemp -d /tmp/cni-vlan-tier.XXXXXX)
trap 'rm -rf "$out"' EXIT
mkdir "$out/bin"
strip -o "$out/bin/bridge" "$multicall"
for p in host-local loopback; do
    ln "$out/bin/bridge" "$out/bin/$p"
done
strip -o "$out/bridge_vlan" "$vlan_test"
strip -o "$out/netlink" "$netlink_test"

step "boot $kernel under emulation (timeout ${timeout_s} s)"
guest_cmd="$root/tests/vm/vlan-tier-guest.sh $out CI=${CI:-}"
vm_start=$(date +%s)
set +e
timeout "$timeout_s" vng -r "$kernel" --disable-kvm --memory 2G --cpus 2 \
    --rwdir "$out" --exec "$guest_cmd" 2>&1 | cat
vng_rc=${PIPESTATUS[0]}
set -e
vm_end=$(date +%s)

for log in "$out"/*.log; do
    [[ -e $log ]] || continue
    step "guest log: $(basename "$log")"
    cat "$log"
done
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
    echo "[vlan tier] FAILED: the VLAN tests failed in the stock kernel (exit $rc)" >&2
    exit "$rc"
fi
echo "[vlan tier] passed"

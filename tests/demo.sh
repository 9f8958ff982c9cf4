#!/usr/bin/env bash
# One-command demo of the plugins, driven by our cnitool as a runtime would drive them.
# Run as root from anywhere in a clone:   sudo tests/demo.sh
#
# - Builds the debug binaries if needed (cargo build: the multi-call plugin binary and
#   cnitool) and lays them out as shipped in target/debug/cni-bin (bridge, host-local,
#   loopback as hard links of the one plugin binary, and cnitool). Set
#   DEMO_BIN_DIR=<dir> to use binaries built elsewhere instead.
# - Everything happens in network namespaces made for the demo: a throwaway "host" netns
#   (where the bridge, the veths and the masquerade rules go) and two "pods". The
#   machine's own network is never touched.
# - Attaches both pods to a dual-stack bridge network with masquerade, prints the
#   results, pings pod to pod and pod to gateway over IPv4 and IPv6, runs CHECK, STATUS,
#   a GC that keeps only the first pod, and DEL.
# - Config (NETCONFPATH), result cache (CNI_CACHE_DIR) and IPAM state (dataDir) live in a
#   temporary directory. Everything the demo made is removed on exit, also on failure or
#   Ctrl-C.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "the demo creates network namespaces: run it as root (sudo $0)"
for tool in ip ping; do
    command -v "$tool" >/dev/null || die "$tool not found (Debian: apt-get install iproute2 iputils-ping)"
done

# --- Binaries ------------------------------------------------------------------------
if [[ -n ${DEMO_BIN_DIR:-} ]]; then
    bin=$DEMO_BIN_DIR
else
    say "Building the debug binaries (cargo build; quick when already built)"
    build=("$root/tests/plugin-dir.sh" debug)
    if [[ -n ${SUDO_USER:-} && $SUDO_USER != root ]]; then
        # Under sudo, build as the user who owns the clone and its toolchain, so the
        # target directory does not end up owned by root.
        home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
        bin=$(cd "$root" && sudo -u "$SUDO_USER" env PATH="$home/.cargo/bin:$PATH" "${build[@]}")
    else
        if ! command -v cargo >/dev/null && [[ -f ${HOME:-/root}/.cargo/env ]]; then
            # shellcheck source=/dev/null
            . "${HOME:-/root}/.cargo/env"
        fi
        command -v cargo >/dev/null || die "cargo not found: install Rust with rustup (https://rustup.rs)"
        bin=$(cd "$root" && "${build[@]}")
    fi
fi
for b in bridge host-local loopback cnitool; do
    [[ -x $bin/$b ]] || die "$bin/$b is missing"
done

# --- Scratch space, removed on exit ----------------------------------------------------
tag=$$
host=cnidemo-host-$tag
pods=("cnidemo-pod1-$tag" "cnidemo-pod2-$tag")
work=$(mktemp -d "${TMPDIR:-/tmp}/cnidemo.XXXXXX")
made_ns=()

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    # Deleting the host netns takes the bridge, the veths and the firewall rules with it.
    for ns in "${made_ns[@]}"; do
        ip netns delete "$ns" 2>/dev/null || true
    done
    rm -rf "$work"
    if ((status == 0)); then
        say "Done: namespaces ${made_ns[*]} and $work removed"
    else
        printf '\ndemo FAILED (exit %d); namespaces and %s removed\n' "$status" "$work" >&2
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for ns in "$host" "${pods[@]}"; do
    ip netns add "$ns"
    made_ns+=("$ns")
done
ip -n "$host" link set lo up

export NETCONFPATH=$work/net.d CNI_PATH=$bin CNI_CACHE_DIR=$work/cache
mkdir -p "$NETCONFPATH"
cat >"$NETCONFPATH/10-demo.conflist" <<EOF
{
    "cniVersion": "1.1.0",
    "name": "demo",
    "plugins": [
        {
            "type": "bridge",
            "bridge": "cnidemo0",
            "isGateway": true,
            "isDefaultGateway": true,
            "ipMasq": true,
            "ipam": {
                "type": "host-local",
                "dataDir": "$work/ipam",
                "ranges": [
                    [{ "subnet": "10.123.0.0/24" }],
                    [{ "subnet": "fd00:123::/64" }]
                ]
            }
        }
    ]
}
EOF

# cnitool runs inside the host netns, as a runtime would on a node.
cnitool() { ip netns exec "$host" "$bin/cnitool" "$@"; }

say "Network config ($NETCONFPATH/10-demo.conflist)"
cat "$NETCONFPATH/10-demo.conflist"

for pod in "${pods[@]}"; do
    say "cnitool add demo /var/run/netns/$pod"
    cnitool add demo "/var/run/netns/$pod"
    echo
done

say "Pod addresses"
for pod in "${pods[@]}"; do
    printf '%s: ' "$pod"
    ip -n "$pod" -brief address show dev eth0
done

say "Masquerade rules in the host netns ($host): traffic leaving the pod subnets"
{
    ip netns exec "$host" iptables-save -t nat 2>/dev/null || true
    ip netns exec "$host" ip6tables-save -t nat 2>/dev/null || true
} | grep -- '-j MASQUERADE' || echo "(none found with iptables-save)"

# First address of a family on a pod's eth0.
addr_of() { ip -n "$1" -o "-$2" address show dev eth0 scope global | awk '{print $4}' | cut -d/ -f1 | head -n1; }
pod2_v4=$(addr_of "${pods[1]}" 4)
pod2_v6=$(addr_of "${pods[1]}" 6)

ping_from() {
    local pod=$1 target=$2
    printf '%s -> %s: ' "$pod" "$target"
    # A few attempts: a fresh IPv6 neighbour can take a moment to resolve.
    for _ in 1 2 3 4 5; do
        if ip netns exec "$pod" ping -c 1 -W 2 "$target" >/dev/null 2>&1; then
            echo ok
            return 0
        fi
    done
    echo FAILED
    return 1
}

say "Ping: pod to pod and pod to gateway, IPv4 and IPv6"
ping_from "${pods[0]}" "$pod2_v4"
ping_from "${pods[0]}" "$pod2_v6"
ping_from "${pods[0]}" 10.123.0.1
ping_from "${pods[0]}" fd00:123::1

say "cnitool check (both pods)"
for pod in "${pods[@]}"; do
    cnitool check demo "/var/run/netns/$pod"
    echo "$pod: CHECK ok"
done

say "cnitool status demo"
cnitool status demo
echo "STATUS ok: the plugins can serve ADD"

say "Result cache ($CNI_CACHE_DIR/results)"
ls "$CNI_CACHE_DIR/results"

say "cnitool gc demo --valid-netns /var/run/netns/${pods[0]}  (keeps ${pods[0]}, ${pods[1]} is stale)"
cnitool gc demo --valid-netns "/var/run/netns/${pods[0]}"
if ip -n "${pods[1]}" link show eth0 >/dev/null 2>&1; then
    die "GC left ${pods[1]}'s eth0"
fi
ip -n "${pods[0]}" link show eth0 >/dev/null || die "GC removed ${pods[0]}'s eth0"
reserved=$(find "$work/ipam/demo" -type f ! -name lock ! -name 'last_reserved_ip.*' ! -name boot.json -printf '%f ')
for a in "$pod2_v4" "$pod2_v6"; do
    [[ " $reserved " != *" $a "* ]] || die "GC left the reservation of $a"
done
echo "${pods[1]}: eth0 gone, addresses released; ${pods[0]}: still attached"
echo "IPAM reservations left: $reserved"

say "cnitool del demo /var/run/netns/${pods[0]}"
cnitool del demo "/var/run/netns/${pods[0]}"
left=$(find "$CNI_CACHE_DIR/results" "$work/ipam/demo" -type f ! -name lock ! -name 'last_reserved_ip.*' ! -name boot.json)
[[ -z $left ]] || die "state left after DEL: $left"
echo "no cache entry and no IP reservation left"

#!/usr/bin/env bash
# Makes this machine look like a busy container host, or undoes that, so the test suite
# can be shown to pass whatever the machine's own state is:
#   tests/busy-node.sh up      # then: tests/run-all.sh
#   tests/busy-node.sh down
# "up" changes the machine's OWN network namespace and files, as a real node has them:
# forwarding on for both families, strict reverse-path filtering, new namespaces
# inheriting every setting (devconf_inherit_init_net=1), a Podman-style cni0 bridge on
# 10.88.0.0/16 with masquerade rules of another network in iptables and nftables, and
# host-local and libcni cache state of that network. "down" restores the saved sysctls
# and removes what "up" made. Run as root; not part of the test command (tests never
# change the machine's own namespace).
set -euo pipefail

state=/run/cni-rs-busy-node
sysctls=(
    net.ipv4.ip_forward
    net.ipv6.conf.all.forwarding
    net.ipv4.conf.all.rp_filter
    net.ipv4.conf.default.rp_filter
    net.core.devconf_inherit_init_net
)
chain=CNI-busynode0000000000000
comment='name: "podman" id: "busynode"'

up() {
    mkdir -p "$state"
    if [[ ! -f $state/sysctls ]]; then
        for s in "${sysctls[@]}"; do echo "$s=$(sysctl -n "$s")"; done >"$state/sysctls"
    fi
    sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 \
        net.ipv4.conf.all.rp_filter=1 net.ipv4.conf.default.rp_filter=1 \
        net.core.devconf_inherit_init_net=1
    if ! ip link show cni0 >/dev/null 2>&1; then
        ip link add cni0 type bridge
        ip addr add 10.88.0.1/16 dev cni0
        ip addr add fd00:88::1/64 dev cni0 nodad
        ip link set cni0 up
    fi
    if ! iptables -t nat -S "$chain" >/dev/null 2>&1; then
        iptables -t nat -N "$chain"
        iptables -t nat -A "$chain" -d 10.88.0.0/16 -j ACCEPT -m comment --comment "$comment"
        iptables -t nat -A "$chain" ! -d 224.0.0.0/4 -j MASQUERADE -m comment --comment "$comment"
        iptables -t nat -A POSTROUTING -s 10.88.0.2 -j "$chain" -m comment --comment "$comment"
    fi
    nft -f - <<NFT
table inet cni_plugins_masquerade {
    chain postrouting {
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr 10.88.0.3 ip daddr != 10.88.0.0/16 masquerade comment "busynode"
    }
}
NFT
    mkdir -p /var/lib/cni/networks/podman /var/lib/cni/results
    printf 'busynode\r\neth0' >/var/lib/cni/networks/podman/10.88.0.2
    printf '10.88.0.2' >/var/lib/cni/networks/podman/last_reserved_ip.0
    : >/var/lib/cni/networks/podman/lock
    echo '{"kind":"cniCacheV1","containerId":"busynode","ifName":"eth0","networkName":"podman"}' \
        >/var/lib/cni/results/podman-busynode-eth0
    echo "busy node state is up"
}

down() {
    if [[ -f $state/sysctls ]]; then
        while IFS= read -r line; do sysctl -qw "$line"; done <"$state/sysctls"
    fi
    ip link del cni0 2>/dev/null || true
    if iptables -t nat -S "$chain" >/dev/null 2>&1; then
        iptables -t nat -D POSTROUTING -s 10.88.0.2 -j "$chain" -m comment --comment "$comment" || true
        iptables -t nat -F "$chain"
        iptables -t nat -X "$chain"
    fi
    nft delete table inet cni_plugins_masquerade 2>/dev/null || true
    rm -rf /var/lib/cni/networks/podman /var/lib/cni/results/podman-busynode-eth0 "$state"
    rmdir /var/lib/cni/results /var/lib/cni/networks /var/lib/cni 2>/dev/null || true
    echo "busy node state is down"
}

case "${1:-}" in
up) up ;;
down) down ;;
*) echo "usage: $0 up|down" >&2; exit 2 ;;
esac

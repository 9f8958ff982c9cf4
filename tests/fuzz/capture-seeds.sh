#!/usr/bin/env bash
# Captures the `netlink` and `nftables` seeds (seeds/netlink, seeds/nftables) from a
# real kernel: in a throwaway network namespace (unshare, as root) it makes what the
# plugins make (a bridge with a veth port, IPv4 and IPv6 addresses, routes with metrics,
# masquerade and host-port rules, a port-security set) and runs examples/capture_seeds.rs
# there. Nothing outside that namespace changes. Run by hand after a decoder learns something new:
#   sudo tests/fuzz/capture-seeds.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# Built outside the namespace (crates may need downloading), run inside it.
target=${CARGO_TARGET_DIR:-$PWD/../../target}/fuzz-plain
CARGO_TARGET_DIR=$target cargo build --quiet --example capture_seeds
capture=$target/debug/examples/capture_seeds

exec unshare --net bash -euo pipefail -c '
ip link set lo up
ip link add cni0 type bridge
ip link add vethA type veth peer name vethB
ip link set vethA master cni0
ip link set vethA type bridge_slave hairpin on isolated on
ip link set cni0 up
ip link set vethA up
ip addr add 10.22.0.1/16 dev cni0
ip -6 addr add fd00:22::1/64 dev cni0 nodad
ip route add 10.23.0.0/16 via 10.22.0.5 metric 100 mtu 1400 advmss 1360
ip -6 route add fd00:23::/64 via fd00:22::5 dev cni0 metric 50
nft -f - <<NFT
table inet cni_plugins_masquerade {
    chain masq_checks {
        comment "masquerade traffic from CNI networks"
        ip daddr 10.22.0.0/16 return comment "cni-net"
        ip6 daddr fd00:22::/64 return
        meta nfproto ipv4 ip daddr != 224.0.0.0/4 masquerade
    }
    chain postrouting {
        type nat hook postrouting priority srcnat; policy accept;
        ip saddr 10.22.0.7 goto masq_checks comment "net-0123456789abcdef-eth0"
        iifname "cni0" counter jump masq_checks
    }
}
table ip cni_hostport {
    chain prerouting {
        type nat hook prerouting priority dstnat; policy accept;
        fib daddr type local tcp dport 8080 dnat to 10.22.0.7:80 comment "hostport"
    }
}
table bridge cni_port_security {
    set port_ipv6 {
        type ifname . ipv6_addr
        elements = { "vethA" . fd00:22::7 comment "156492b196ad91ce0e8bd807 ctrA eth0",
                     "vethA" . fe80::42:acff:fe11:2 comment "156492b196ad91ce0e8bd807 ctrA eth0" }
    }
}
NFT
"$1" "$2"
' capture "$capture" "$PWD/seeds"

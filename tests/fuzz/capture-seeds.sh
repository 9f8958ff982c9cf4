#!/usr/bin/env bash
# Captures the `netlink` and `nftables` seeds (seeds/netlink, seeds/nftables) from a
# real kernel: in a throwaway network namespace (unshare, as root) it makes what the
# plugins make (a bridge with a veth port, IPv4 and IPv6 addresses, routes with metrics,
# masquerade and host-port rules, a port-security set) and what the node agent's overlay
# makes (VXLAN devices of both families with FDB and neighbour entries and onlink
# routes), and runs examples/capture_seeds.rs
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
ip link set vethB up
ip addr add 192.168.100.1/24 dev vethB
ip -6 addr add fd00:100::1/64 dev vethB nodad
ip link add vx4 address 0a:58:c0:a8:64:01 mtu 1450 type vxlan id 4242 local 192.168.100.1 dev vethB dstport 4789 nolearning udpcsum
ip link add vx6 address 0a:a1:b2:c3:d4:01 mtu 1430 type vxlan id 4242 local fd00:100::1 dev vethB dstport 4789 nolearning noudp6zerocsumtx noudp6zerocsumrx
ip link set vx4 up
ip link set vx6 up
ip addr add 10.244.1.0/32 dev vx4
ip -6 addr add fd00:244:1::/128 dev vx6 nodad
bridge fdb add 0a:58:c0:a8:64:02 dev vx4 dst 192.168.100.2 self permanent
bridge fdb add 0a:a1:b2:c3:d4:02 dev vx6 dst fd00:100::2 self permanent
ip neigh add 10.244.2.0 lladdr 0a:58:c0:a8:64:02 dev vx4 nud permanent
ip neigh add fd00:244:2:: lladdr 0a:a1:b2:c3:d4:02 dev vx6 nud permanent
ip route add 10.244.2.0/24 via 10.244.2.0 dev vx4 onlink
ip -6 route add fd00:244:2::/64 via fd00:244:2:: dev vx6 onlink
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

# shellcheck shell=sh
# Sourced by the scripts that run inside the stock-kernel guest (vlan-tier-guest.sh,
# encryption-guest.sh). It defines:
#
#   uptime_s            the guest's uptime in seconds, as /proc/uptime gives it.
#   since_s T0          seconds since uptime T0, to one decimal.
#   load_node_modules   the modules a node running the agent has loaded long before it
#                       starts. Loaded on demand instead, each is a modprobe process
#                       under emulation that the agents' first passes (or a timed sync)
#                       wait for, and br_netfilter, which nothing loads on demand, would
#                       fail the agents' NetworkPolicy step and keep them retrying.

uptime_s() { cut -d' ' -f1 /proc/uptime; }

since_s() { echo "$(uptime_s) $1" | awk '{printf "%.1f", $1 - $2}'; }

load_node_modules() {
    t0=$(uptime_s)
    for m in br_netfilter wireguard vxlan nf_tables nft_chain_nat nft_masq nft_ct \
        nft_fib_inet nft_reject_inet nft_log nft_limit nfnetlink_log; do
        modprobe "$m" || echo "[guest] modprobe $m failed"
    done
    echo "[guest] modules loaded in $(since_s "$t0") s"
}

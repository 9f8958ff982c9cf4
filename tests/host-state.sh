#!/usr/bin/env bash
# The machine state the test command must leave as it found it (docs/testing.md):
#
#   tests/host-state.sh snapshot FILE    record it
#   tests/host-state.sh compare FILE     exit 1, listing every difference, if it changed
#
# Recorded: the links, addresses and routes of the network namespace it runs in (run it
# with `ip netns exec` to look at another), the list of named network namespaces, the
# iptables and ip6tables rules (counters left out), the nftables rule set (counters left
# out), the installed kernel packages, and what is under /boot, /var/lib/cni and
# /etc/cni/net.d (HOST_STATE_DIRS replaces that list: the test of this script uses its
# own directories).
set -euo pipefail

dirs=${HOST_STATE_DIRS:-/boot /var/lib/cni /etc/cni/net.d}

state() {
    echo "## links"
    ip -o link show | awk '{sub(/@.*/, "", $2); print $2, $3}' | sort
    echo "## addresses"
    ip -o addr show | awk '{print $2, $3, $4}' | sort
    echo "## routes"
    # A route learnt from a router advertisement counts down its lifetime. A kernel
    # without IPv6 has no IPv6 routes to list (and `ip -6` fails there).
    {
        ip -4 route show table all
        if [[ -d /proc/sys/net/ipv6 ]]; then ip -6 route show table all; fi
    } | sed '/ expires /d' | sort
    echo "## network namespaces"
    ip netns list | awk '{print $1}' | sort
    for save in iptables-save ip6tables-save; do
        echo "## $save"
        if command -v "$save" >/dev/null; then
            "$save" | sed -E '/^#/d; s/ \[[0-9]+:[0-9]+\]$//'
        fi
    done
    echo "## nft ruleset"
    if command -v nft >/dev/null; then
        nft list ruleset | sed -E 's/counter packets [0-9]+ bytes [0-9]+/counter/'
    fi
    echo "## kernel packages"
    if command -v dpkg-query >/dev/null; then
        # Every package, filtered here: a pattern that matches nothing makes dpkg-query
        # fail, which would hide a real failure behind "no kernel installed".
        dpkg-query -W -f='${Package} ${Version} ${Status}\n' |
            awk 'index($1, "linux-image-") == 1 && $NF == "installed"' | sort
    fi
    for dir in $dirs; do
        echo "## files under $dir"
        if [[ -e $dir ]]; then
            # A directory's own time and size move when a file comes and goes again.
            find "$dir" \( -type d -printf '%p d %m\n' \) -o \
                -printf '%p %y %s %m %TY-%Tm-%Td %TT\n' | sort
        fi
    done
}

case ${1:-} in
    snapshot)
        state > "${2:?usage: host-state.sh snapshot FILE}"
        ;;
    compare)
        before=${2:?usage: host-state.sh compare FILE}
        now=$(mktemp)
        trap 'rm -f "$now"' EXIT
        state > "$now"
        if ! diff -u --label "at the start" --label "now" "$before" "$now"; then
            echo "error: the machine's state changed (lines with - were there at the start, + are new)" >&2
            exit 1
        fi
        ;;
    *)
        echo "usage: tests/host-state.sh snapshot FILE | compare FILE" >&2
        exit 2
        ;;
esac

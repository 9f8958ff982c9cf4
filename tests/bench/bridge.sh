#!/usr/bin/env bash
# Benchmark: bridge + host-local ADD and DEL of one pod, ours (release build) against the
# reference (/usr/lib/cni, Debian containernetworking-plugins), in one run, inside
# throwaway network namespaces (a "host" netns per side, one pod netns per iteration).
#
#   tests/bench/bridge.sh                 # BENCH_OPS=30 pods per side by default
#   BENCH_OPS=100 REFERENCE_DIR=/opt/cni/bin tests/bench/bridge.sh
#
# Prints mean wall time per ADD and per DEL in ms (process start and the IPAM delegate
# included) and the largest peak RSS seen (KiB, GNU time's %M) of the bridge process.
# This is a benchmark, not a test: nothing here asserts on time.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

OPS=${BENCH_OPS:-30}
REFERENCE_DIR=${REFERENCE_DIR:-/usr/lib/cni}
[[ $(id -u) -eq 0 ]] || { echo "error: run as root (network namespaces)" >&2; exit 1; }
[[ -x $REFERENCE_DIR/bridge ]] || { echo "error: no reference bridge in $REFERENCE_DIR" >&2; exit 1; }
[[ -x /usr/bin/time ]] || { echo "error: GNU time (/usr/bin/time) is needed" >&2; exit 1; }

cargo build --release -q -p cni-bridge -p cni-host-local
target_dir=$(cargo metadata --format-version 1 --no-deps | jq -r .target_directory)
OURS_DIR=$target_dir/release

tag="bb$$"
work=$(mktemp -d)
namespaces=()
cleanup() {
    for ns in "${namespaces[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# Runs one plugin call in the side's host netns; records wall ms and peak RSS.
call() { # side dir command id pod_path config_file
    local side=$1 dir=$2 command=$3 id=$4 pod=$5 config=$6 start end
    start=$(date +%s%N)
    ip netns exec "$tag-$side" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        CNI_COMMAND="$command" CNI_CONTAINERID="$id" CNI_NETNS="$pod" CNI_IFNAME=eth0 \
        CNI_PATH="$dir" /usr/bin/time -f %M -o "$work/rss" "$dir/bridge" <"$config" >"$work/out" \
        || { echo "error: $side $command failed: $(cat "$work/out")" >&2; exit 1; }
    end=$(date +%s%N)
    echo $(((end - start) / 1000)) >>"$work/$side-$command.us"
    cat "$work/rss" >>"$work/$side.rss"
}

run_side() { # side dir
    local side=$1 dir=$2 config="$work/$1.json"
    ip netns add "$tag-$side"
    namespaces+=("$tag-$side")
    cat >"$config" <<EOF
{"cniVersion":"1.0.0","name":"bench-$side","type":"bridge","bridge":"br-$side",
 "isDefaultGateway":true,"ipMasq":true,
 "ipam":{"type":"host-local","dataDir":"$work/data-$side",
         "ranges":[[{"subnet":"10.123.0.0/16"}],[{"subnet":"fd00:123::/64"}]]}}
EOF
    for i in $(seq 1 "$OPS"); do
        ip netns add "$tag-$side-p$i"
        namespaces+=("$tag-$side-p$i")
        call "$side" "$dir" ADD "ctr$i" "/var/run/netns/$tag-$side-p$i" "$config"
    done
    for i in $(seq 1 "$OPS"); do
        call "$side" "$dir" DEL "ctr$i" "/var/run/netns/$tag-$side-p$i" "$config"
    done
}

mean_ms() { awk '{ s += $1 } END { printf "%.2f", s / NR / 1000 }' "$1"; }
max_kib() { sort -n "$1" | tail -1; }

run_side ours "$OURS_DIR"
run_side ref "$REFERENCE_DIR"

printf '%s pods per side, dual-stack, isDefaultGateway + ipMasq (iptables)\n\n' "$OPS"
printf '| plugin | ADD ms | DEL ms | peak RSS KiB |\n|---|---:|---:|---:|\n'
printf '| ours | %s | %s | %s |\n' "$(mean_ms "$work/ours-ADD.us")" "$(mean_ms "$work/ours-DEL.us")" "$(max_kib "$work/ours.rss")"
printf '| reference | %s | %s | %s |\n' "$(mean_ms "$work/ref-ADD.us")" "$(mean_ms "$work/ref-DEL.us")" "$(max_kib "$work/ref.rss")"

# Sourced by the benchmarks of a chained plugin (portmap.sh, bandwidth.sh) from the
# repository's root: `chained_plugin_bench <plugin> <tag> <driver.py>` checks for root and
# the reference plugin, builds ours (the static release, unless BENCH_OURS_DIR is set),
# runs the driver in throwaway namespaces named `$BENCH_TAG-…` (default `<tag><pid>`,
# removed on exit), and judges its figures with tests/bench/judge.py <plugin> unless
# BENCH_JUDGE=0. Exits with the driver's or the judge's failure.
chained_plugin_bench() {
    local plugin=$1 tag=$2 driver=$3
    [[ $(id -u) -eq 0 ]] || { echo "error: run as root (network namespaces)" >&2; exit 1; }
    REFERENCE_DIR=${REFERENCE_DIR:-/usr/lib/cni}
    [[ -x $REFERENCE_DIR/$plugin ]] || {
        echo "error: no reference $plugin in $REFERENCE_DIR (apt-get install containernetworking-plugins)" >&2
        exit 1
    }
    if [[ -z ${BENCH_OURS_DIR:-} ]]; then
        if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
            # shellcheck source=/dev/null
            . "${HOME:-/root}/.cargo/env"
        fi
        echo "==> cargo build --release (static, as deploy/release.sh ships it)" >&2
        BENCH_OURS_DIR=$(tests/plugin-dir.sh static)
    fi
    export BENCH_TAG=${BENCH_TAG:-$tag$$}
    trap 'for ns in $(ip netns list | awk "{print \$1}" | grep "^${BENCH_TAG}-" || true); do
        ip netns delete "$ns" 2>/dev/null || true
    done' EXIT

    local out=${BENCH_OUT:-target/bench} smoke=() status=0
    if [[ -n ${BENCH_SMOKE:-} && ${BENCH_SMOKE} != 0 || -n ${BENCH_QUICK:-} && ${BENCH_QUICK} != 0 ]]; then
        export BENCH_SMOKE=1
        smoke=(--smoke)
    fi
    /usr/bin/python3 "$driver" --ours "$BENCH_OURS_DIR" --ref "$REFERENCE_DIR" \
        --out "$out" "${smoke[@]}" || status=$?
    if [[ ${BENCH_JUDGE:-1} == 0 ]]; then
        echo "$plugin: not judged (BENCH_JUDGE=0)" >&2
    else
        BENCH_OUT=$out /usr/bin/python3 tests/bench/judge.py "$plugin" || status=1
    fi
    exit "$status"
}

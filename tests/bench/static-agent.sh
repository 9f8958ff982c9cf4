# Sourced by the node agent's benchmarks (cluster.sh, network-policy.sh, agent-soak.sh)
# from the repository's root: finds cargo, builds cni-node as the release builds it
# (static), and sets `agent` to its path and `out` to the benchmarks' output directory
# ($BENCH_OUT, default target/bench), made if missing; `run` is smoke or full
# (BENCH_SMOKE), `started` and `load0` the start's time and load average, and
# `write_machine <bench> <scale>` writes $out/<bench>/machine.txt, the run's
# circumstances that tests/bench/write-docs.py puts beside the recorded figures.
started=$(date +%s)
load0=$(cut -d' ' -f1 /proc/loadavg)
run=full
[[ ${BENCH_SMOKE:-0} != 0 ]] && run=smoke
if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi
triple=x86_64-unknown-linux-gnu
RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static -C relocation-model=static" \
    cargo build --locked --release --target "$triple" -p cni-node
agent="${CARGO_TARGET_DIR:-target}/$triple/release/cni-node"
echo "agent: $agent ($(stat -c %s "$agent") bytes)"
out=${BENCH_OUT:-target/bench}
mkdir -p "$out"

write_machine() {
    local cpu commit
    cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
    commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
    [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]] && commit+="+changes"
    mkdir -p "$out/$1"
    {
        echo "run: $run"
        echo "date: $(date -u -d "@$started" '+%Y-%m-%d %H:%M UTC')"
        echo "machine: ${cpu:-unknown CPU}, $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)"
        echo "commit: $commit"
        echo "load: $load0 at the start, $(cut -d' ' -f1 /proc/loadavg) at the end"
        echo "duration: $(($(date +%s) - started)) s"
        echo "scale: $2"
    } >"$out/$1/machine.txt"
}

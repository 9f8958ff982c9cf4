# Sourced by the node agent's benchmarks (cluster.sh, network-policy.sh, agent-soak.sh) from the
# repository's root: finds cargo, builds cni-node as the release builds it (static),
# and sets `agent` to its path and `out` to the benchmarks' output directory
# ($BENCH_OUT, default target/bench), made if missing.
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

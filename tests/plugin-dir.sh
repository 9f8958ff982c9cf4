#!/usr/bin/env bash
# Builds the plugins and lays them out as they ship; prints the directory:
#
#   tests/plugin-dir.sh [debug|release|static]      # default debug
#
# `static` is the release build linked as deploy/release.sh ships it (static, non-PIE),
# under <target>/x86_64-unknown-linux-gnu/release.
#
# The plugins are one multi-call executable (cni-plugins-rs, package cni-plugins);
# <target>/<profile>/cni-bin/ gets bridge, host-local and loopback as hard links of it
# (so a bridge runs host-local in-process, as on a node), and cnitool. GNU `ln -f` renames
# a new link over an existing name, so a concurrent user never finds a name missing.
# Build output goes to stderr; stdout is the directory alone (for dir=$(...)).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
profile=${1:-debug}
triple=x86_64-unknown-linux-gnu
case "$profile" in
    debug) flags=() ;;
    release) flags=(--release) ;;
    static)
        flags=(--release --target "$triple")
        export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static -C relocation-model=static"
        ;;
    *) echo "plugin-dir.sh: profile must be debug, release or static, not $profile" >&2; exit 2 ;;
esac
if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi
cargo build -q "${flags[@]}" --bins -p cni-plugins -p cnitool >&2
target=$(cargo metadata --format-version 1 --no-deps \
    | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
case "$profile" in
    static) built=$target/$triple/release ;;
    *) built=$target/$profile ;;
esac
dir=$built/cni-bin
mkdir -p "$dir"
for plugin in bridge host-local loopback portmap bandwidth; do
    ln -f "$built/cni-plugins-rs" "$dir/$plugin"
done
ln -f "$built/cnitool" "$dir/cnitool"
echo "$dir"

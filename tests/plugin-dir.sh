#!/usr/bin/env bash
# Builds the plugins and lays them out as they ship; prints the directory:
#
#   tests/plugin-dir.sh [debug|release]      # default debug
#
# The plugins are one multi-call executable (cni-plugins-rs, package cni-plugins);
# <target>/<profile>/cni-bin/ gets bridge, host-local and loopback as hard links of it
# (so a bridge runs host-local in-process, as on a node), and cnitool. GNU `ln -f` renames
# a new link over an existing name, so a concurrent user never finds a name missing.
# Build output goes to stderr; stdout is the directory alone (for dir=$(...)).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
profile=${1:-debug}
case "$profile" in
    debug) flags=() ;;
    release) flags=(--release) ;;
    *) echo "plugin-dir.sh: profile must be debug or release, not $profile" >&2; exit 2 ;;
esac
if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi
cargo build -q "${flags[@]}" --bins -p cni-plugins -p cnitool >&2
target=$(cargo metadata --format-version 1 --no-deps \
    | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
built=$target/$profile
dir=$built/cni-bin
mkdir -p "$dir"
for plugin in bridge host-local loopback; do
    ln -f "$built/cni-plugins-rs" "$dir/$plugin"
done
ln -f "$built/cnitool" "$dir/cnitool"
echo "$dir"

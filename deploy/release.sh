#!/usr/bin/env bash
# Builds the static release tarball, like the reference plugins' releases:
#
#   deploy/release.sh [--out DIR] [--profile PROFILE]
#
# makes DIR/cni-plugins-rs-linux-amd64-v<version>.tgz (flat: bridge, host-local, loopback, portmap, bandwidth,
# cni-installer, cni-node, README.md, LICENSE) and beside it .sha256 and .sha512 files holding
# "<hash>  <file name>". DIR defaults to target/dist, PROFILE to release. bridge,
# host-local, loopback, portmap and bandwidth are one multi-call executable (cni-plugins-rs), stored as hard
# links of one file (tar keeps the link: one copy of the bytes in the archive).
#
# The binaries are linked statically against glibc (-C target-feature=+crt-static on
# x86_64-unknown-linux-gnu; --target keeps the flags away from build scripts and
# proc-macros), so they run on any x86_64 Linux, in a FROM scratch image too. They are
# not position-independent (-C relocation-model=static), like the reference's Go
# binaries: a static-pie would work too, but ldd calls it "statically linked" rather than
# "not a dynamic executable". The script fails unless ldd calls every binary "not a
# dynamic executable" and every binary's about line (each plugin name run from the
# staged links) names this version.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=target/dist
profile=release
while (($#)); do
    case "$1" in
        --out) out=${2:?--out needs a directory}; shift 2 ;;
        --out=*) out=${1#--out=}; shift ;;
        --profile) profile=${2:?--profile needs a name}; shift 2 ;;
        --profile=*) profile=${1#--profile=}; shift ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "release.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
    esac
done

if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi

triple=x86_64-unknown-linux-gnu
plugins=(bridge host-local loopback portmap bandwidth)
multicall=cni-plugins-rs
pkgid=$(cargo pkgid -p cni-installer)
version=${pkgid##*[#@]}
name="cni-plugins-rs-linux-amd64-v${version}.tgz"

echo "==> building v${version} (${profile}, static, ${triple})"
RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static -C relocation-model=static" \
    cargo build --locked --profile "$profile" --target "$triple" \
    -p cni-plugins -p cni-installer -p cni-node

case "$profile" in
    dev) profile_dir=debug ;;
    *) profile_dir=$profile ;;
esac
bin_dir="${CARGO_TARGET_DIR:-target}/${triple}/${profile_dir}"

stage=$(mktemp -d)
chmod 0755 "$stage"
trap 'rm -rf "$stage"' EXIT
install -m 0755 "$bin_dir/$multicall" "$stage/${plugins[0]}"
for plugin in "${plugins[@]:1}"; do
    ln "$stage/${plugins[0]}" "$stage/$plugin"
done
install -m 0755 "$bin_dir/cni-installer" "$stage/cni-installer"
install -m 0755 "$bin_dir/cni-node" "$stage/cni-node"

echo "==> checking the binaries"
for bin in "${plugins[@]}" cni-installer cni-node; do
    path="$stage/$bin"
    linkage=$(ldd "$path" 2>&1 || true)
    if [[ "$linkage" != *"not a dynamic executable"* ]]; then
        echo "release.sh: $path is not static; ldd says:" >&2
        echo "$linkage" >&2
        exit 1
    fi
    if [[ "$bin" == cni-installer || "$bin" == cni-node ]]; then
        about=$(env -i "$path" --version)
    else
        # With no CNI_COMMAND a plugin prints its about line on stderr.
        about=$(env -i "$path" 2>&1 >/dev/null | head -n 1)
        if [[ "$about" != "CNI $bin plugin "* ]]; then
            echo "release.sh: $path does not run as $bin: $about" >&2
            exit 1
        fi
    fi
    if [[ "$about" != *" v${version} (cni-plugins-rs, commit "* ]]; then
        echo "release.sh: $path does not say v${version}: $about" >&2
        exit 1
    fi
    printf '%-14s %s | %s\n' "$bin" "$(echo "$linkage" | tr -d '\t')" "$about"
done
links=$(stat -c %h "$stage/${plugins[0]}")
if [[ "$links" != "${#plugins[@]}" ]]; then
    echo "release.sh: the plugins are not ${#plugins[@]} hard links of one file ($links)" >&2
    exit 1
fi
install -m 0644 README.md LICENSE "$stage/"

mkdir -p "$out"
# Reproducible archive: fixed order, owner and time (the commit's), no gzip timestamp.
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@${epoch}" \
    -C "$stage" -cf - . | gzip -9n >"$out/$name"
(
    cd "$out"
    sha256sum "$name" >"$name.sha256"
    sha512sum "$name" >"$name.sha512"
)

echo "==> $out/$name"
tar -tvzf "$out/$name"
cat "$out/$name.sha256" "$out/$name.sha512"

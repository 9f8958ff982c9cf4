#!/usr/bin/env bash
# The one test command of this repository (docs/testing.md; .ci/run calls it).
# Run as root on Debian 12:  tests/run-all.sh
#
# Installs what the tests need (apt packages; crates come through cargo), then runs
# format check, clippy, the API docs, a debug build of the plugins, the whole test suite,
# the check that the docs' figures are those of the recorded benchmark runs, every
# benchmark at its smoke scale judged against tests/bench/targets.toml, the fuzz targets
# for a short time and the stock-kernel VM tier, and checks that the machine is left as
# it was found. A green run ends with the benchmarks' verdict tables and the figures the tests
# measured.
# With CI=true (set by .ci/run) root tests fail instead of skipping when a privilege is
# missing; the variable is passed through to cargo test untouched.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

skip_vm=false
if [[ -n ${CNI_RS_SKIP_VM:-} && ${CNI_RS_SKIP_VM} != 0 ]]; then
    if [[ ${CI:-} == true ]]; then
        echo "error: CNI_RS_SKIP_VM is set under CI=true: CI runs every tier" >&2
        exit 1
    fi
    skip_vm=true
fi

# Debian packages: iproute2/iptables/nftables/ping to drive and inspect namespaces and
# firewall state; the reference Go plugins (containernetworking-plugins) and libcni
# sources (golang-github-appc-cni-dev, with golang-go) for compatibility checks; podman,
# runc and busybox-static for runtime-level tests; ca-certificates for cargo's downloads;
# procps (kill) and util-linux (nsenter, unshare) for the Podman suite's private namespaces;
# containerd (with its runc shim) for the CRI suite, and protobuf-compiler (protoc) to
# build that suite's CRI client (the k8s-cri crate compiles its protos at build time).
# libc6-dev (glibc's static archives) and git (the commit stamp) for deploy/release.sh,
# which the image/installer test runs.
# python3-matplotlib and time (GNU time) for the benchmark's smoke test (tests/bench/run.sh).
packages=(
    iproute2 iptables nftables iputils-ping procps util-linux
    containernetworking-plugins golang-go golang-github-appc-cni-dev
    podman runc busybox-static ca-certificates
    containerd protobuf-compiler
    libc6-dev git
    python3-matplotlib time
)
missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if ((${#missing[@]})); then
    step "apt-get install ${missing[*]}"
    if [[ $(id -u) -ne 0 ]]; then
        echo "error: missing packages (${missing[*]}) and not root: run tests/run-all.sh as root" >&2
        exit 1
    fi
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${packages[@]}"
else
    step "apt packages already installed"
fi

# From here on the machine must end as it is now (network state of this netns, named
# namespaces, firewall rules, kernel packages, /boot, /var/lib/cni, /etc/cni/net.d):
# checked at the end by tests/host-state.sh.
host_state=$(mktemp /tmp/cni-rs-host-state.XXXXXX)
trap 'rm -f "$host_state"' EXIT
tests/host-state.sh snapshot "$host_state"

if ! command -v cargo >/dev/null && [[ -f "${HOME:-/root}/.cargo/env" ]]; then
    # shellcheck source=/dev/null
    . "${HOME:-/root}/.cargo/env"
fi
command -v cargo >/dev/null || { echo "error: cargo not found (install Rust with rustup)" >&2; exit 1; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo doc (API docs build without a warning)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "cargo build (debug, plugin binaries)"
cargo build --workspace --bins

# Figures the tests measure (convergence times, gaps: cni_blackbox::measured) are
# appended here and printed at the end of a green run.
measured=$(mktemp /tmp/cni-rs-measured.XXXXXX)
trap 'rm -f "$host_state" "$measured"' EXIT

step "cargo test (CI=${CI:-unset})"
CNI_RS_MEASURED=$measured cargo test --workspace --no-fail-fast

step "the docs' figures are those of the recorded benchmark runs (tests/bench/write-docs.py --check)"
/usr/bin/python3 tests/bench/write-docs.py --check

# Every benchmark at its reduced scale, on the static release build as shipped, each
# judged against its smoke bounds in tests/bench/targets.toml (docs/performance.md).
step "benchmarks, smoke scale (tests/bench/check.sh --smoke)"
bench_out=$(mktemp -d /tmp/cni-rs-bench.XXXXXX)
trap 'rm -rf "$host_state" "$measured" "$bench_out"' EXIT
bench_start=$(date +%s)
BENCH_OUT=$bench_out tests/bench/check.sh --smoke
echo "benchmark stage took $(($(date +%s) - bench_start)) s"

# Coverage-guided fuzzing (AFL++ on the stable toolchain) of every parser of input,
# netlink answers and cnitool's cache: each target for a short fixed time. Installs
# cargo-afl and AFL++ into a cache on the first run (tests/fuzz/README.md).
step "fuzz targets (tests/fuzz/run.sh, FUZZ_SECONDS=${FUZZ_SECONDS:-25} each)"
fuzz_start=$(date +%s)
tests/fuzz/run.sh
echo "fuzz stage took $(($(date +%s) - fuzz_start)) s"

# The bridge VLAN tests need bridge VLAN filtering and the encryption tests WireGuard,
# which this kernel lacks: they run on Debian's stock kernel in an emulated VM (installs
# qemu and kmod; the kernel and virtme-ng go into a cache, see the script).
# CNI_RS_SKIP_VM=1 skips this slow tier on a developer's machine; CI never skips it.
if $skip_vm; then
    step "stock-kernel VM tier skipped (CNI_RS_SKIP_VM=$CNI_RS_SKIP_VM)"
else
    step "stock-kernel VM tier (bridge VLAN and WireGuard tests)"
    vlan_tier_start=$(date +%s)
    CNI_RS_MEASURED=$measured tests/vm/run-vlan-tier.sh
    echo "stock-kernel VM tier took $(($(date +%s) - vlan_tier_start)) s"
fi

step "the machine is as it was (tests/host-state.sh)"
tests/host-state.sh compare "$host_state"

step "benchmark verdicts (smoke run)"
cat "$bench_out/verdicts.md"

step "figures measured by the tests (test binary, what, value, unit)"
if [[ -s $measured ]]; then
    awk -F'\t' '{ printf "%-28s %s: %s %s\n", $1, $2, $3, $4 }' "$measured"
else
    echo "(none)"
fi

step "all checks passed"

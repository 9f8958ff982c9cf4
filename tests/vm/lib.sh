# shellcheck shell=bash
# Sourced by the scripts that boot Debian's stock kernel under emulation
# (tests/vm/run-vlan-tier.sh, tests/bench/encryption.sh), from the repository's root,
# with `set -euo pipefail`. It defines:
#
#   vm_prepare        QEMU and the tools (apt-get, as root, when missing), virtme-ng in a
#                     venv, the kernel package that linux-image-amd64 points at,
#                     downloaded and unpacked (nothing is installed into /boot or
#                     /lib/modules and no bootloader or initramfs hook runs); sets
#                     `kernel` (the vmlinuz to boot) and puts the venv on PATH.
#   cargo_executables reads cargo's JSON messages on stdin, prints `<target> <path>` for
#                     each executable built.
#   vm_stage_bin DIR MULTICALL CNITOOL AGENT
#                     DIR/bin as a node has it: the plugins as hard links of the one
#                     multi-call binary, cnitool and cni-node, all stripped (debug
#                     builds are ~50 MB, mostly debug info, and every byte crosses 9p
#                     under emulation).
#   vm_boot TIMEOUT RWDIR CMD
#                     boots `kernel` with 2 CPUs and 2 GiB, the host's files visible
#                     read-only and RWDIR read-write, runs CMD in it, and sets `vng_rc`
#                     (124: killed after TIMEOUT seconds).
#
# `vm_step` and `vm_die` print with the caller's `vm_label` (e.g. "vlan tier").
#
# The cache of the kernel and the venv is $CNI_RS_VM_CACHE, else
# $XDG_CACHE_HOME/cni-plugins-rs/vm, else target/vm-cache in the repository; a second
# run reuses both. VNG_VENV (default <cache>/vng) and VNG_VERSION (default 1.42) say
# where and which virtme-ng.
#
# Measured facts behind the choices: this machine's KVM cannot boot a stock kernel, so
# it runs under pure emulation (`vng --disable-kvm`), where boot takes 25-40 s and
# process starts are 20-60x slower than native; vng's output is piped through `cat`
# (QEMU reopens stdout/stderr, a redirect to a file scrambles them).

vm_label=${vm_label:-vm}
vm_step() { printf '\n==> [%s] %s\n' "$vm_label" "$*"; }
vm_die() { echo "error: [$vm_label] $*" >&2; exit 1; }

vm_prepare() {
    local cache venv vng_version p pkg kroot dir
    if [[ -n ${CNI_RS_VM_CACHE:-} ]]; then
        cache=$CNI_RS_VM_CACHE
    elif [[ -n ${XDG_CACHE_HOME:-} ]]; then
        cache=$XDG_CACHE_HOME/cni-plugins-rs/vm
    else
        cache=$PWD/target/vm-cache
    fi
    mkdir -p "$cache"
    cache=$(cd "$cache" && pwd)
    venv=${VNG_VENV:-$cache/vng}
    vng_version=${VNG_VERSION:-1.42}

    # Debian's python3 (not a pyenv one that may come first in PATH) builds the venv, so
    # the venv outlives changes to the user's Python setup; pip into a venv needs no
    # --break-system-packages. kmod's depmod indexes the unpacked modules.
    # wireguard-tools' `wg` is the operator's hand in the WireGuard test (a peer removed
    # by hand).
    local packages=(qemu-system-x86 python3-venv binutils kmod iproute2 iputils-ping
        wireguard-tools)
    local missing=()
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if ((${#missing[@]})); then
        [[ $(id -u) -eq 0 ]] || vm_die "missing packages (${missing[*]}) and not root"
        vm_step "apt-get install ${missing[*]}"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q \
            --no-install-recommends "${missing[@]}"
    fi
    if ! "$venv/bin/vng" --version 2>/dev/null | grep -qx "virtme-ng $vng_version"; then
        vm_step "pip install virtme-ng==$vng_version into $venv"
        # A venv moved from where it was made keeps scripts that start a Python that
        # is not there: made again.
        "$venv/bin/python3" -c '' 2>/dev/null || /usr/bin/python3 -m venv --clear "$venv"
        "$venv/bin/pip" install -q "virtme-ng==$vng_version"
    fi
    # vng starts its helpers (virtme-run) from PATH.
    export PATH="$venv/bin:$PATH"

    pkg=$(vm_kernel_package)
    if [[ -z $pkg ]]; then
        vm_step "apt-get update (no package list names linux-image-amd64's kernel)"
        apt-get update -q
        pkg=$(vm_kernel_package)
    fi
    [[ -n $pkg ]] || vm_die "apt cannot tell which kernel package linux-image-amd64 depends on"
    kroot=$cache/$pkg
    if [[ ! -f $kroot/unpacked ]]; then
        vm_step "apt-get download $pkg; dpkg-deb -x into $kroot (nothing is installed)"
        rm -rf "$kroot" "$kroot.tmp"
        mkdir -p "$kroot.tmp"
        (cd "$kroot.tmp" && apt-get download -q "$pkg")
        dpkg-deb -x "$kroot.tmp/${pkg}"_*.deb "$kroot.tmp/root"
        rm -f "$kroot.tmp/${pkg}"_*.deb
        for dir in "$kroot.tmp/root/lib/modules/"*/; do
            depmod -b "$kroot.tmp/root" "$(basename "$dir")"
        done
        touch "$kroot.tmp/unpacked"
        mv "$kroot.tmp" "$kroot"
    fi
    kernel=$(find "$kroot/root/boot" -maxdepth 1 -name 'vmlinuz-*' | sort -V | tail -n 1)
    [[ -n $kernel ]] || vm_die "no vmlinuz in $kroot/root/boot"
    [[ -d $kroot/root/lib/modules/${kernel##*/vmlinuz-} ]] || vm_die "no modules for $kernel in $kroot"
}

# The versioned kernel package the meta-package points at (linux-image-6.1.0-N-amd64).
vm_kernel_package() {
    apt-cache depends linux-image-amd64 2>/dev/null |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}'
}

cargo_executables() {
    /usr/bin/python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], m["executable"])
'
}

vm_stage_bin() {
    local dir=$1 multicall=$2 cnitool=$3 agent=$4 p
    mkdir -p "$dir/bin"
    strip -o "$dir/bin/bridge" "$multicall"
    for p in host-local loopback portmap bandwidth; do
        ln "$dir/bin/bridge" "$dir/bin/$p"
    done
    strip -o "$dir/bin/cnitool" "$cnitool"
    strip -o "$dir/bin/cni-node" "$agent"
}

vm_boot() {
    local timeout_s=$1 rwdir=$2 cmd=$3
    vm_step "boot $kernel under emulation (timeout ${timeout_s} s)"
    set +e
    timeout "$timeout_s" vng -r "$kernel" --disable-kvm --memory 2G --cpus 2 \
        --rwdir "$rwdir" --exec "$cmd" 2>&1 | cat
    # shellcheck disable=SC2034 # the caller's to read
    vng_rc=${PIPESTATUS[0]}
    set -e
}

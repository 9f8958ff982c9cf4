#!/usr/bin/env bash
# The fuzz stage of the test command (tests/run-all.sh calls it): builds every target of
# this directory with AFL++ (afl.rs, on the stable toolchain) and fuzzes each for a fixed
# time, starting from seeds/<target>/. A crash, or an input that still hangs when replayed
# alone, fails it, naming the input.
#
#   tests/fuzz/run.sh                      # every target, FUZZ_SECONDS (25) each
#   FUZZ_SECONDS=600 tests/fuzz/run.sh netlink nftables   # longer, some targets
#
# Installs cargo-afl (crates.io, pinned to the afl crate of Cargo.lock) and the AFL++ it
# builds into a cache: $CNI_RS_FUZZ_CACHE, else target/fuzz-cache; a second run reuses
# them. Builds into $CARGO_TARGET_DIR/fuzz (default target/fuzz); each target's AFL++
# output (queue, crashes, hangs, log) is in target/fuzz/out/<target>, replaced by the
# next run. FUZZ_JOBS targets run at once (default: the number of CPUs).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$here"

seconds=${FUZZ_SECONDS:-25}
jobs=${FUZZ_JOBS:-$(nproc)}
all_targets=(netconf result host_local bridge_config bandwidth_config netlink nftables cnitool_cache)
if (($#)); then targets=("$@"); else targets=("${all_targets[@]}"); fi
for t in "${targets[@]}"; do
    [[ -d seeds/$t ]] || { echo "error: no target $t (no seeds/$t)" >&2; exit 2; }
done

if [[ -n ${CNI_RS_FUZZ_CACHE:-} ]]; then
    cache=$CNI_RS_FUZZ_CACHE
else
    cache=$root/target/fuzz-cache
fi
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}/fuzz
out=$target_dir/out

started=$(date +%s)
elapsed() { echo "$(($(date +%s) - started)) s"; }

# cargo-afl must match the afl crate the targets link (its runtime and AFL++ build).
afl_version=$(awk '/^name = "afl"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
export PATH=$cache/bin:$PATH
# afl.rs keeps the AFL++ it builds under $XDG_DATA_HOME/afl.rs.
export XDG_DATA_HOME=$cache/share
installed=$(cargo afl --version 2>/dev/null | awk '{ print $2 }') || true
if [[ $installed != "$afl_version" ]]; then
    echo "fuzz: installing cargo-afl $afl_version into $cache"
    # Its own build directory, whatever CARGO_TARGET_DIR says, removed once installed.
    cargo install --quiet --locked --force --root "$cache" --target-dir "$cache/build" \
        cargo-afl --version "=$afl_version"
    rm -rf "$cache/build"
fi
# Installing cargo-afl builds AFL++ for the toolchain of the moment, into a directory
# afl.rs names after rustc's version and commit; after a toolchain update it is built
# again here (`config --build` refuses to when it is there).
rustc_id=$(rustc -vV | awk '/^release:/ { r = $2 } /^commit-hash:/ { h = substr($2, 1, 7) }
    END { print "rustc-" r "-" h }')
afl_dir=$XDG_DATA_HOME/afl.rs/$rustc_id/afl.rs-$afl_version
if [[ ! -x $afl_dir/afl/bin/afl-fuzz || ! -f $afl_dir/afl-llvm/afl-compiler-rt.o ]]; then
    echo "fuzz: building AFL++ into $afl_dir"
    cargo afl config --build --force >"$cache/afl-config.log" 2>&1 || {
        cat "$cache/afl-config.log" >&2
        exit 1
    }
fi
echo "fuzz: cargo-afl and AFL++ ready ($(elapsed))"

CARGO_TARGET_DIR=$target_dir cargo afl build --quiet --release --locked --bins
bin=$target_dir/release
echo "fuzz: targets built ($(elapsed))"

# Every seed must pass before fuzzing starts: a failing one is a regression.
for t in "${targets[@]}"; do
    for seed in seeds/"$t"/*; do
        if ! "$bin/$t" <"$seed" >/dev/null 2>"$out.replay.log"; then
            cat "$out.replay.log" >&2
            echo "error: seed $here/$seed fails target $t" >&2
            exit 1
        fi
    done
done
rm -f "$out.replay.log"

export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1
# Several instances at once on a shared machine: let the scheduler place them.
export AFL_NO_AFFINITY=1
rm -rf "$out"
mkdir -p "$out"

fuzz_one() {
    local t=$1 dir=$out/$1
    # -t: a parser that takes 2 s on one input is stuck, not slow.
    if ! cargo afl fuzz -V "$seconds" -t 2000 -i "seeds/$t" -o "$dir" -- "$bin/$t" \
        >"$dir.log" 2>&1; then
        echo "fuzz: $t: afl-fuzz failed, see $dir.log" >&2
        tail -n 30 "$dir.log" >&2
        return 1
    fi
}

echo "fuzz: ${#targets[@]} targets, ${seconds} s each, $jobs at a time"
failed=()
pids=()
names=()
for t in "${targets[@]}"; do
    while ((${#pids[@]} >= jobs)); do
        wait "${pids[0]}" || failed+=("${names[0]}")
        pids=("${pids[@]:1}")
        names=("${names[@]:1}")
    done
    fuzz_one "$t" &
    pids+=($!)
    names+=("$t")
done
for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || failed+=("${names[$i]}")
done

field() { awk -F' *: *' -v k="$2" '$1 == k { print $2 }' "$1"; }
found=0
for t in "${targets[@]}"; do
    stats=$out/$t/default/fuzzer_stats
    if [[ -f $stats ]]; then
        echo "fuzz: $t: $(field "$stats" execs_done) runs, $(field "$stats" corpus_count)" \
            "inputs in the corpus, $(field "$stats" saved_crashes) crashes," \
            "$(field "$stats" saved_hangs) hangs"
    fi
    for input in "$out/$t/default/crashes"/id:*; do
        [[ -e $input ]] || continue
        found=1
        echo "error: $t: crash: $input" >&2
        echo "  replay: $bin/$t < '$input'" >&2
        "$bin/$t" <"$input" 2>&1 | grep -m1 -A2 panicked | sed 's/^/  /' >&2 || true
    done
    # AFL++ also saves an input as a hang when the machine was too busy to run it in
    # time: one is a finding only if it is still running after 10 s on its own.
    for input in "$out/$t/default/hangs"/id:*; do
        [[ -e $input ]] || continue
        if timeout 10 "$bin/$t" <"$input" >/dev/null 2>&1; then
            echo "fuzz: $t: timed out under AFL++ but runs at once alone (a busy machine): $input"
            continue
        fi
        found=1
        echo "error: $t: hang or crash when replayed: $input" >&2
        echo "  replay: $bin/$t < '$input'" >&2
    done
done
if ((${#failed[@]})) || ((found)); then
    ((${#failed[@]})) && echo "error: fuzzing did not run for: ${failed[*]}" >&2
    echo "fuzz: FAILED ($(elapsed))" >&2
    exit 1
fi
echo "fuzz: every target ran ${seconds} s without a crash or hang ($(elapsed))"

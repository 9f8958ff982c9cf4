//! AFL++ entry of the `cnitool_cache` target; its body is `cni_fuzz::cnitool_cache`.

fn main() {
    afl::fuzz!(|data: &[u8]| cni_fuzz::cnitool_cache(data));
}

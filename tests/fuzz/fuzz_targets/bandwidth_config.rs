//! AFL++ entry of the `bandwidth_config` target; its body is `cni_fuzz::bandwidth_config`.

fn main() {
    afl::fuzz!(|data: &[u8]| cni_fuzz::bandwidth_config(data));
}

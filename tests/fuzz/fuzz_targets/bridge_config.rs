//! AFL++ entry of the `bridge_config` target; its body is `cni_fuzz::bridge_config`.

fn main() {
    afl::fuzz!(|data: &[u8]| cni_fuzz::bridge_config(data));
}

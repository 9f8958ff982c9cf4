//! AFL++ entry of the `result` target; its body is `cni_fuzz::result`.

fn main() {
    afl::fuzz!(|data: &[u8]| cni_fuzz::result(data));
}

//! AFL++ entry of the `host_local` target; its body is `cni_fuzz::host_local`.

fn main() {
    afl::fuzz!(|data: &[u8]| cni_fuzz::host_local(data));
}

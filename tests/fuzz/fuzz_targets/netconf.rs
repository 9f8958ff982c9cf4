//! AFL++ entry of the `netconf` target; its body is `cni_fuzz::netconf`.

fn main() {
    afl::fuzz!(|data: &[u8]| cni_fuzz::netconf(data));
}

//! AFL++ entry of the `nftables` target; its body is `cni_fuzz::nftables`.

fn main() {
    afl::fuzz!(|data: &[u8]| cni_fuzz::nftables(data));
}

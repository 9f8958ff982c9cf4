//! AFL++ entry of the `netlink` target; its body is `cni_fuzz::netlink`.

fn main() {
    afl::fuzz!(|data: &[u8]| cni_fuzz::netlink(data));
}

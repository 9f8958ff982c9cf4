//! Unique names for everything a test creates.
//!
//! Tests of several test binaries run at the same time (and in parallel threads within a
//! binary), and a killed run may leave namespaces behind, so names combine a prefix, the
//! process id and a per-process counter.

use std::sync::atomic::{AtomicU64, Ordering};

/// Longest Linux link name in bytes (`IFNAMSIZ` - 1).
pub const MAX_IFNAME_LEN: usize = 15;

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn next() -> u64 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// `<prefix>-<pid>-<counter>`: for namespaces, network names, container ids, directories.
///
/// Only characters valid in container ids and network names (`[a-zA-Z0-9_.-]`) are added,
/// so the result is valid wherever the prefix is.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), next())
}

/// A unique name of at most [`MAX_IFNAME_LEN`] bytes, for links (bridges, veths).
///
/// pid and counter are written in base 36 so that they fit; the prefix is cut to what
/// remains (it should be ASCII and short, e.g. `br`).
pub fn unique_ifname(prefix: &str) -> String {
    let tail = format!(
        "{}-{}",
        base36(u64::from(std::process::id())),
        base36(next())
    );
    let room = MAX_IFNAME_LEN.saturating_sub(tail.len());
    let cut: String = prefix.chars().filter(char::is_ascii).take(room).collect();
    format!("{cut}{tail}")
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[usize::try_from(n % 36).unwrap_or(0)]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_carry_prefix_and_pid() {
        let a = unique_name("cnibb");
        let b = unique_name("cnibb");
        assert_ne!(a, b);
        assert!(
            a.starts_with(&format!("cnibb-{}-", std::process::id())),
            "{a}"
        );
    }

    #[test]
    fn ifnames_fit_in_ifnamsiz_even_with_long_prefix() {
        for prefix in ["", "br", "averyverylongprefixindeed"] {
            let n = unique_ifname(prefix);
            assert!(n.len() <= MAX_IFNAME_LEN, "{n:?} is {} bytes", n.len());
            assert_ne!(n, unique_ifname(prefix));
        }
        assert!(unique_ifname("br").starts_with("br"));
    }

    #[test]
    fn base36_covers_extremes() {
        assert_eq!(base36(0), "0");
        assert_eq!(base36(35), "z");
        assert_eq!(base36(36), "10");
        // pid_max is 2^22 on 64-bit Linux: 5 digits, so tail ≤ 5 + 1 + counter digits.
        assert_eq!(base36(4_194_304), "2hwcg");
    }
}

//! Names and comments of the rules, byte-identical to the reference plugins.
//!
//! Operators (and the reference plugins themselves, after a downgrade) find
//! rules by these names: a chain or comment that differs by one character
//! leaks rules on DEL. Everything here is pure and pinned by tests against
//! values observed from the reference binaries.

use sha2::{Digest, Sha512};

/// Prefix of the per-container iptables chains.
pub const IPTABLES_CHAIN_PREFIX: &str = "CNI-";

/// iptables chain names are at most 28 characters in the reference
/// (`CNI-` + 24 hex digits).
const IPTABLES_CHAIN_LEN: usize = 28;

/// nftables' maximum comment length (`NFT_USERDATA_MAXLEN` as knftables
/// enforces it).
pub const NFT_COMMENT_MAX: usize = 128;

/// Lower-case hex of SHA-512 over `data`.
fn sha512_hex(data: &str) -> String {
    use std::fmt::Write;
    Sha512::digest(data.as_bytes())
        .iter()
        .fold(String::with_capacity(128), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// First `n` hex digits of SHA-512 over `data`.
fn hash_prefix(data: &str, n: usize) -> String {
    let mut h = sha512_hex(data);
    h.truncate(n);
    h
}

/// The per-container iptables chain: `CNI-` + first 24 hex digits of
/// SHA-512(network + containerID).
pub fn iptables_chain_name(network: &str, container_id: &str) -> String {
    let hash = hash_prefix(
        &format!("{network}{container_id}"),
        IPTABLES_CHAIN_LEN - IPTABLES_CHAIN_PREFIX.len(),
    );
    format!("{IPTABLES_CHAIN_PREFIX}{hash}")
}

/// The portmap plugin's per-container iptables chain: `CNI-DN-` + the first
/// 21 hex digits of SHA-512(network + containerID).
pub fn hostport_dnat_chain(network: &str, container_id: &str) -> String {
    const PREFIX: &str = "CNI-DN-";
    let hash = hash_prefix(
        &format!("{network}{container_id}"),
        IPTABLES_CHAIN_LEN - PREFIX.len(),
    );
    format!("{PREFIX}{hash}")
}

/// The per-container chain of portmap versions before 0.7 (`CNI-SN-`),
/// which teardown still removes, as the reference does.
pub fn hostport_old_snat_chain(network: &str, container_id: &str) -> String {
    const PREFIX: &str = "CNI-SN-";
    let hash = hash_prefix(
        &format!("{network}{container_id}"),
        IPTABLES_CHAIN_LEN - PREFIX.len(),
    );
    format!("{PREFIX}{hash}")
}

/// The comment on the portmap plugin's jumps to its per-container chain:
/// `dnat name: "<network>" id: "<containerID>"`, cut to the 255 bytes
/// iptables takes (the reference cuts to 256, which iptables refuses).
pub fn hostport_comment(network: &str, container_id: &str) -> String {
    let full = format!(
        "dnat name: {} id: {}",
        go_quote(network),
        go_quote(container_id)
    );
    if full.len() <= 255 {
        return full;
    }
    let mut cut = 252;
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &full[..cut])
}

/// Parses a [`hostport_comment`] back into `(network, containerID)`.
pub fn parse_hostport_comment(comment: &str) -> Option<(String, String)> {
    parse_iptables_comment(comment.strip_prefix("dnat ")?)
}

/// The comment on every iptables masquerade rule:
/// `name: "<network>" id: "<containerID>"` (Go `%q` quoting).
pub fn iptables_comment(network: &str, container_id: &str) -> String {
    format!("name: {} id: {}", go_quote(network), go_quote(container_id))
}

/// Parses an [`iptables_comment`] back into `(network, containerID)`.
pub fn parse_iptables_comment(comment: &str) -> Option<(String, String)> {
    let rest = comment.strip_prefix("name: ")?;
    let (network, rest) = parse_go_quoted(rest)?;
    let rest = rest.strip_prefix(" id: ")?;
    let (container_id, rest) = parse_go_quoted(rest)?;
    rest.is_empty().then_some((network, container_id))
}

/// Hash identifying a network in nftables masquerade comments.
pub fn nft_network_hash(network: &str) -> String {
    hash_prefix(network, 16)
}

/// Hash identifying one attachment in nftables masquerade comments; every
/// rule of the attachment has a comment starting with it.
pub fn nft_instance_hash(network: &str, ifname: &str, container_id: &str) -> String {
    format!(
        "{}-{}",
        nft_network_hash(network),
        hash_prefix(&format!("{ifname}:{container_id}"), 16)
    )
}

/// The comment of an attachment's nftables masquerade rules:
/// `<hash>, net: <network>, if: <ifname>, id: <cid>`, double quotes removed,
/// cut to [`NFT_COMMENT_MAX`] bytes.
pub fn nft_comment(network: &str, ifname: &str, container_id: &str) -> String {
    let strip = |s: &str| s.replace('"', "");
    let mut comment = format!(
        "{}, net: {}, if: {}, id: {}",
        nft_instance_hash(network, ifname, container_id),
        strip(network),
        strip(ifname),
        strip(container_id)
    );
    if comment.len() > NFT_COMMENT_MAX {
        let mut end = NFT_COMMENT_MAX;
        while !comment.is_char_boundary(end) {
            end -= 1;
        }
        comment.truncate(end);
    }
    comment
}

/// `<cid>-<ifname>`, the reference's id of an attachment's spoof check.
pub fn macspoof_ref_id(container_id: &str, ifname: &str) -> String {
    format!("{container_id}-{ifname}")
}

/// Prefix of the per-attachment spoof-check chains.
pub const MACSPOOF_CHAIN_PREFIX: &str = "cni-br-iface-";

/// Prefix of the spoof-check rule comments.
pub const MACSPOOF_COMMENT_PREFIX: &str = "macspoofchk-";

/// `cni-br-iface-<cid>-<ifname>`.
pub fn macspoof_iface_chain(container_id: &str, ifname: &str) -> String {
    format!(
        "{MACSPOOF_CHAIN_PREFIX}{}",
        macspoof_ref_id(container_id, ifname)
    )
}

/// `cni-br-iface-<cid>-<ifname>-mac`.
pub fn macspoof_mac_chain(container_id: &str, ifname: &str) -> String {
    format!("{}-mac", macspoof_iface_chain(container_id, ifname))
}

/// `macspoofchk-<cid>-<ifname>`.
pub fn macspoof_comment(container_id: &str, ifname: &str) -> String {
    format!(
        "{MACSPOOF_COMMENT_PREFIX}{}",
        macspoof_ref_id(container_id, ifname)
    )
}

/// The `portSecurity` id of an attachment, which every set element of its port
/// carries first in its comment: the first 24 hex digits of SHA-512(containerID + "/" +
/// ifname). A hash, because container IDs may be far longer than a comment holds.
/// Ours; the reference has no such rules.
pub fn port_security_id(container_id: &str, ifname: &str) -> String {
    hash_prefix(&format!("{container_id}/{ifname}"), 24)
}

/// Quotes like Go's `%q` (`strconv.Quote`), so that messages and comments
/// match the reference byte for byte.
pub fn go_quote(s: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Reads one Go-quoted string from the start of `s`; returns its value and
/// the rest of `s`.
fn parse_go_quoted(s: &str) -> Option<(String, &str)> {
    let mut chars = s.strip_prefix('"')?.char_indices();
    let body = &s[1..];
    let mut out = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &body[i + 1..])),
            '\\' => {
                let (_, e) = chars.next()?;
                let simple = match e {
                    '"' => Some('"'),
                    '\\' => Some('\\'),
                    '\'' => Some('\''),
                    'a' => Some('\u{7}'),
                    'b' => Some('\u{8}'),
                    'f' => Some('\u{c}'),
                    'n' => Some('\n'),
                    'r' => Some('\r'),
                    't' => Some('\t'),
                    'v' => Some('\u{b}'),
                    _ => None,
                };
                if let Some(ch) = simple {
                    out.push(ch);
                    continue;
                }
                let digits = match e {
                    'x' => 2,
                    'u' => 4,
                    'U' => 8,
                    _ => return None,
                };
                let mut code = 0u32;
                for _ in 0..digits {
                    code = code * 16 + chars.next()?.1.to_digit(16)?;
                }
                out.push(char::from_u32(code)?);
            }
            c => out.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_chain_matches_reference() {
        // Observed from the reference bridge plugin.
        assert_eq!(
            iptables_chain_name("mynet", "ctrA"),
            "CNI-f55d1ff5e9696738bd206b7d"
        );
        assert_eq!(iptables_chain_name("mynet", "ctrA").len(), 28);
    }

    #[test]
    fn hostport_names_match_reference() {
        // What the reference portmap 1.1.1 created for network "net1", container "cid1".
        assert_eq!(
            hostport_dnat_chain("net1", "cid1"),
            "CNI-DN-e8f6f419596f7f47b3468"
        );
        assert_eq!(
            hostport_comment("net1", "cid1"),
            r#"dnat name: "net1" id: "cid1""#
        );
        assert_eq!(
            parse_hostport_comment(r#"dnat name: "net1" id: "cid1""#),
            Some(("net1".to_owned(), "cid1".to_owned()))
        );
        assert_eq!(hostport_comment("n", &"x".repeat(300)).len(), 255);
    }

    #[test]
    fn iptables_comment_matches_reference() {
        assert_eq!(
            iptables_comment("mynet", "ctrA"),
            r#"name: "mynet" id: "ctrA""#
        );
    }

    #[test]
    fn iptables_comment_round_trips() {
        assert_eq!(
            parse_iptables_comment(r#"name: "mynet" id: "ctrA""#),
            Some(("mynet".into(), "ctrA".into()))
        );
        let odd = iptables_comment("we\"ird\\net", "c\tid\u{1}");
        assert_eq!(odd, r#"name: "we\"ird\\net" id: "c\tid\x01""#);
        assert_eq!(
            parse_iptables_comment(&odd),
            Some(("we\"ird\\net".into(), "c\tid\u{1}".into()))
        );
        assert_eq!(parse_iptables_comment(r#"name: "a" id: "b" x"#), None);
        assert_eq!(parse_iptables_comment("kube-proxy rule"), None);
        assert_eq!(parse_iptables_comment(r#"name: "a" id: "b"#), None);
    }

    #[test]
    fn nft_comment_matches_reference() {
        // Observed from the reference bridge plugin v1.6.0.
        assert_eq!(nft_network_hash("nftnet"), "e47d63df51ce7720");
        assert_eq!(
            nft_instance_hash("nftnet", "eth1", "ctrG"),
            "e47d63df51ce7720-2a2f354c438bf177"
        );
        assert_eq!(
            nft_comment("nftnet", "eth1", "ctrG"),
            "e47d63df51ce7720-2a2f354c438bf177, net: nftnet, if: eth1, id: ctrG"
        );
    }

    #[test]
    fn nft_comment_strips_quotes_and_truncates() {
        let c = nft_comment("n\"et", "eth0", "ctr");
        assert!(c.ends_with(", net: net, if: eth0, id: ctr"), "{c}");
        // The hash is computed over the unstripped name.
        assert!(c.starts_with(&nft_instance_hash("n\"et", "eth0", "ctr")));

        let long_id = "a".repeat(200);
        let c = nft_comment("nftnet", "eth0", &long_id);
        assert_eq!(c.len(), 128);
        assert!(c.starts_with("e47d63df51ce7720-"));
    }

    #[test]
    fn macspoof_names_match_reference() {
        assert_eq!(macspoof_ref_id("ctrA", "eth0"), "ctrA-eth0");
        assert_eq!(
            macspoof_iface_chain("ctrA", "eth0"),
            "cni-br-iface-ctrA-eth0"
        );
        assert_eq!(
            macspoof_mac_chain("ctrA", "eth0"),
            "cni-br-iface-ctrA-eth0-mac"
        );
        assert_eq!(macspoof_comment("ctrA", "eth0"), "macspoofchk-ctrA-eth0");
    }

    #[test]
    fn go_quote_matches_strconv_quote() {
        assert_eq!(go_quote("ipfw"), r#""ipfw""#);
        assert_eq!(go_quote(""), r#""""#);
        assert_eq!(go_quote("a\"b\\c\nd\u{7f}é"), r#""a\"b\\c\nd\x7fé""#);
    }
}

//! Pieces of nf_tables rules and chains that several features build alike: address
//! matches and verdicts in the expressions `nft` compiles them to (masquerade, host
//! ports, egress SNAT, the MAC spoof check and port security all use them), and the
//! bridge family's prerouting base chain (the MAC spoof check's and port security's).

use std::net::IpAddr;

use crate::error::Result;
use crate::nfnetlink::{
    BASE_NETWORK, Batch, CMP_EQ, Data, Expr, HOOK_BRIDGE_PREROUTING, Hook, META_NFPROTO,
    NFPROTO_BRIDGE, NFPROTO_IPV4, NFPROTO_IPV6, POLICY_ACCEPT, REG_1, REG_VERDICT,
};

/// An address's bytes in network order, as nf_tables compares them.
pub(crate) fn addr_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// `meta nfproto ipv4|ipv6`, which nft puts before any `ip`/`ip6` match in
/// an `inet` table.
pub(crate) fn nfproto(ip: IpAddr) -> [Expr; 2] {
    let proto = if ip.is_ipv4() {
        NFPROTO_IPV4
    } else {
        NFPROTO_IPV6
    };
    [
        Expr::Meta {
            key: META_NFPROTO,
            dreg: REG_1,
        },
        Expr::Cmp {
            sreg: REG_1,
            op: CMP_EQ,
            data: vec![proto],
        },
    ]
}

/// Which address of the IP header a match reads.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Field {
    /// The source address.
    Saddr,
    /// The destination address.
    Daddr,
}

/// `ip[6] saddr|daddr ==|!= <addr>/<prefix>` as nft compiles it: a whole
/// address is loaded and compared; a byte-aligned prefix loads and compares
/// only its bytes; any other prefix (also /0) loads the whole address and
/// masks it first.
pub(crate) fn addr_match(field: Field, op: u32, addr: IpAddr, prefix: u8) -> Vec<Expr> {
    let bytes = addr_bytes(addr);
    let full = bytes.len();
    let offset = match (addr.is_ipv4(), field) {
        (true, Field::Saddr) => 12,
        (true, Field::Daddr) => 16,
        (false, Field::Saddr) => 8,
        (false, Field::Daddr) => 24,
    };
    let prefix = usize::from(prefix).min(full * 8);
    let load = |len: usize| Expr::Payload {
        dreg: REG_1,
        base: BASE_NETWORK,
        offset,
        len: len as u32,
    };
    let mut out = Vec::from(nfproto(addr));
    if prefix == full * 8 || (prefix > 0 && prefix % 8 == 0) {
        let len = if prefix == full * 8 { full } else { prefix / 8 };
        out.push(load(len));
        out.push(Expr::Cmp {
            sreg: REG_1,
            op,
            data: bytes[..len].to_vec(),
        });
    } else {
        let mask: Vec<u8> = (0..full)
            .map(|i| {
                let bits = prefix.saturating_sub(i * 8).min(8);
                (0xffu16 << (8 - bits)) as u8
            })
            .collect();
        let masked = bytes.iter().zip(&mask).map(|(b, m)| b & m).collect();
        out.push(load(full));
        out.push(Expr::Bitwise {
            sreg: REG_1,
            dreg: REG_1,
            len: full as u32,
            mask,
            xor: vec![0; full],
        });
        out.push(Expr::Cmp {
            sreg: REG_1,
            op,
            data: masked,
        });
    }
    out
}

/// `accept`, `drop`, `return`, or `jump`/`goto` `chain` (a verdict into the verdict
/// register).
pub(crate) fn verdict(code: i32, chain: Option<&str>) -> Expr {
    Expr::Immediate {
        dreg: REG_VERDICT,
        data: Data::Verdict {
            code,
            chain: chain.map(Into::into),
        },
    }
}

/// Adds `table`'s base chain `chain` of type filter on the bridge family's prerouting
/// hook, at `priority`, with policy accept (adding it again changes nothing). The
/// MAC spoof check's `bridge nat PREROUTING` and port security's
/// `bridge cni_port_security prerouting` are such chains.
pub(crate) fn add_bridge_prerouting(
    b: &mut Batch,
    table: &str,
    chain: &str,
    priority: i32,
) -> Result<()> {
    let hook = Hook {
        chain_type: "filter",
        hooknum: HOOK_BRIDGE_PREROUTING,
        priority,
        policy: Some(POLICY_ACCEPT),
    };
    b.add_chain(NFPROTO_BRIDGE, table, chain, Some(hook), None)
}

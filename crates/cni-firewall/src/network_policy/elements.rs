//! The table's sets and their elements: the specs of the verdict maps, the pending
//! sets, the profiles' box sets, the tier profiles' maps of peers and the tier rows'
//! verdict maps, and the shared peer sets; and how an address, a box (address range,
//! protocol range, port range), a tier profile's peer range, a tier box (protocol and
//! port ranges with a verdict chain), a pending pod or a `goto` to a profile or row
//! becomes an element and back.

use super::*;

/// The field lengths of a box key: address, protocol, port.
pub(super) const BOX_FIELDS_V4: [u32; 3] = [4, 1, 2];
pub(super) const BOX_FIELDS_V6: [u32; 3] = [16, 1, 2];

pub(super) fn map_spec(name: &str, family: Family) -> SetSpec<'_> {
    SetSpec {
        name,
        key_type: family.addr_type(),
        key_len: family.addr_len(),
        fields: &[],
        interval: false,
        verdict_map: true,
        key_byteorder: BYTEORDER_BIG_ENDIAN,
    }
}

/// A shared peer set of one family: plain addresses, hashed.
pub(super) fn peer_spec(name: &str, family: Family) -> SetSpec<'_> {
    SetSpec {
        name,
        verdict_map: false,
        ..map_spec("", family)
    }
}

pub(super) fn pending_spec(family: Family) -> SetSpec<'static> {
    SetSpec {
        name: family.pending(),
        verdict_map: false,
        ..map_spec("", family)
    }
}

pub(super) fn box_spec(name: &str, family: Family) -> SetSpec<'_> {
    SetSpec {
        name,
        key_type: (family.addr_type() << 12) | (TYPE_INET_PROTO << 6) | TYPE_INET_SERVICE,
        key_len: family.addr_len() + 8,
        fields: match family {
            Family::V4 => &BOX_FIELDS_V4,
            Family::V6 => &BOX_FIELDS_V6,
        },
        interval: true,
        verdict_map: false,
        key_byteorder: 0,
    }
}

/// The field lengths of a tier profile's range key (address, protocol) and of a tier
/// row's key (protocol, port).
const TIER_RANGE_FIELDS_V4: [u32; 2] = [4, 1];
const TIER_RANGE_FIELDS_V6: [u32; 2] = [16, 1];
const TIER_KEY_FIELDS: [u32; 2] = [1, 2];

/// A tier profile's map of peer ranges of one family, each on every protocol (the
/// kernel's map of ranges over a concatenation, whose elements are cheap to take out,
/// wants two fields).
pub(super) fn tier_ranges_spec(name: &str, family: Family) -> SetSpec<'_> {
    SetSpec {
        name,
        key_type: (family.addr_type() << 6) | TYPE_INET_PROTO,
        key_len: family.addr_len() + 4,
        fields: match family {
            Family::V4 => &TIER_RANGE_FIELDS_V4,
            Family::V6 => &TIER_RANGE_FIELDS_V6,
        },
        interval: true,
        verdict_map: true,
        key_byteorder: 0,
    }
}

/// A tier row's verdict map: (protocol, port) ranges to verdict chains.
pub(super) fn tier_keys_spec(name: &str) -> SetSpec<'_> {
    SetSpec {
        name,
        key_type: (TYPE_INET_PROTO << 6) | TYPE_INET_SERVICE,
        key_len: 8,
        fields: &TIER_KEY_FIELDS,
        interval: true,
        verdict_map: true,
        key_byteorder: 0,
    }
}

/// A range's key corner: the address, and a protocol padded to 4 bytes.
fn range_key(ip: IpAddr, protocol: u8) -> Vec<u8> {
    let mut key = addr_bytes(ip);
    key.extend_from_slice(&[protocol, 0, 0, 0]);
    key
}

/// A tier profile's range of peers: a `goto` to its row's chain.
pub(super) fn tier_range_element(r: &TierRange, chain: String) -> Element {
    Element {
        key: range_key(r.first, 0),
        key_end: Some(range_key(r.last, u8::MAX)),
        verdict: Some((VERDICT_GOTO, Some(chain))),
        ..Element::default()
    }
}

/// A range element's addresses and the chain it goes to.
pub(super) fn decode_tier_range(e: &Element, family: Family) -> Option<(IpAddr, IpAddr, &str)> {
    let corner = |key: &[u8]| -> Option<(IpAddr, u8)> {
        let len = key.len().checked_sub(4)?;
        Some((addr_of(&key[..len])?, key[len]))
    };
    let (first, p0) = corner(&e.key)?;
    let (last, p1) = corner(e.key_end.as_deref()?)?;
    let chain = match &e.verdict {
        Some((VERDICT_GOTO, Some(chain))) => chain.as_str(),
        _ => return None,
    };
    (Family::of(first) == family
        && Family::of(last) == family
        && first <= last
        && (p0, p1) == (0, u8::MAX))
        .then_some((first, last, chain))
}

/// A key corner of a tier row's box: protocol and port, each padded to 4 bytes.
fn tier_key(protocol: u8, port: u16) -> Vec<u8> {
    let mut key = vec![protocol, 0, 0, 0];
    key.extend_from_slice(&port.to_be_bytes());
    key.extend_from_slice(&[0, 0]);
    key
}

/// A tier box: its keys, and a `goto` to its verdict chain.
pub(super) fn tier_box_element(b: &TierBox) -> Element {
    Element {
        key: tier_key(b.protocols.0, b.ports.0),
        key_end: Some(tier_key(b.protocols.1, b.ports.1)),
        verdict: Some((VERDICT_GOTO, Some(b.chain.to_string()))),
        ..Element::default()
    }
}

pub(super) fn decode_tier_box(e: &Element) -> Option<TierBox> {
    let corner = |key: &[u8]| -> Option<(u8, u16)> {
        (key.len() == 8).then(|| (key[0], u16::from_be_bytes([key[4], key[5]])))
    };
    let (p0, d0) = corner(&e.key)?;
    let (p1, d1) = corner(e.key_end.as_deref().unwrap_or(&e.key))?;
    let b = match &e.verdict {
        Some((VERDICT_GOTO, Some(chain))) if valid_verdict_chain(chain) => TierBox {
            protocols: (p0, p1),
            ports: (d0, d1),
            chain: chain.as_str().into(),
        },
        _ => return None,
    };
    b.check(&String::new).is_ok().then_some(b)
}

pub(super) fn addr_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// A box corner as nf_tables lays out the concatenation: each field padded to 4
/// bytes.
pub(super) fn box_key(ip: IpAddr, protocol: u8, port: u16) -> Vec<u8> {
    let mut key = addr_bytes(ip);
    key.extend_from_slice(&[protocol, 0, 0, 0]);
    key.extend_from_slice(&port.to_be_bytes());
    key.extend_from_slice(&[0, 0]);
    key
}

pub(super) fn box_element(a: &Allow) -> Element {
    Element {
        key: box_key(a.first, a.protocols.0, a.ports.0),
        key_end: Some(box_key(a.last, a.protocols.1, a.ports.1)),
        ..Element::default()
    }
}

pub(super) fn decode_corner(key: &[u8]) -> Option<(IpAddr, u8, u16)> {
    let len = key.len().checked_sub(8)?;
    let ip = addr_of(&key[..len])?;
    Some((
        ip,
        key[len],
        u16::from_be_bytes([key[len + 4], key[len + 5]]),
    ))
}

pub(super) fn decode_box(e: &Element, family: Family) -> Option<Allow> {
    let (first, p0, d0) = decode_corner(&e.key)?;
    let (last, p1, d1) = decode_corner(e.key_end.as_deref().unwrap_or(&e.key))?;
    let a = Allow {
        first,
        last,
        protocols: (p0, p1),
        ports: (d0, d1),
    };
    (a.family() == family && a.check(&String::new).is_ok()).then_some(a)
}

pub(super) fn addr_element(ip: IpAddr) -> Element {
    Element {
        key: addr_bytes(ip),
        ..Element::default()
    }
}

/// A pending address, with the pod it was added for.
pub(super) fn pending_element(ip: IpAddr, pod: Option<&str>) -> Element {
    Element {
        key: addr_bytes(ip),
        comment: pod.map(pod_tag),
        ..Element::default()
    }
}

/// Longest pod name kept whole in a pending element's comment (nft's comments hold
/// 254 bytes).
pub(super) const POD_TAG_MAX: usize = 200;

/// What a pending element's comment holds of its pod's `namespace/name`: all of it,
/// or, when too long, its start and a hash of the whole (the same for the same pod,
/// which is all a comparison needs).
pub(super) fn pod_tag(pod: &str) -> String {
    if pod.len() <= POD_TAG_MAX {
        return pod.to_owned();
    }
    let mut end = 120;
    while !pod.is_char_boundary(end) {
        end -= 1;
    }
    // SHA-512, which the plugins carry already for the reference's chain names.
    let hash: String = sha2::Sha512::digest(pod.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{}... sha512:{hash}", &pod[..end])
}

/// A pod's map element: a `goto` to its profile's chain (the profile's verdict ends
/// the direction's judgement, not the chain that looked the pod up).
pub(super) fn goto_element(ip: IpAddr, chain: String) -> Element {
    Element {
        key: addr_bytes(ip),
        verdict: Some((VERDICT_GOTO, Some(chain))),
        ..Element::default()
    }
}

//! Traffic control over rtnetlink, as the bandwidth plugin shapes a pod: a token
//! bucket (`tbf`) as a link's root qdisc, the `ingress` qdisc, a `u32` filter that
//! matches every packet and redirects it (`mirred`) to an `ifb` device, the `ifb`
//! device itself, and dumps of qdiscs and filters to read all of it back.
//!
//! The messages are laid out as the reference plugin's netlink library lays them
//! out, so that `tc` shows the same state whichever plugin made it.

use cni_netlink::wire::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, c_string, u32_ne,
};
use cni_netlink::{Malformed, Writer, attrs};

use super::Netlink;
use super::rtnl::{
    IFF_UP, IFLA_IFNAME, IFLA_INFO_KIND, IFLA_LINKINFO, IFLA_MTU, IFLA_TXQLEN, IfInfo, RTM_NEWLINK,
};
use crate::error::Result;

pub(super) const RTM_NEWQDISC: u16 = 36;
const RTM_DELQDISC: u16 = 37;
const RTM_GETQDISC: u16 = 38;
pub(super) const RTM_NEWTFILTER: u16 = 44;
const RTM_GETTFILTER: u16 = 46;

const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;

const TCA_TBF_PARMS: u16 = 1;
const TCA_TBF_RTAB: u16 = 2;
const TCA_TBF_RATE64: u16 = 4;
const TCA_TBF_BURST: u16 = 6;

const TCA_U32_CLASSID: u16 = 1;
const TCA_U32_SEL: u16 = 5;
const TCA_U32_ACT: u16 = 7;
/// `tc_u32_sel.flags`: a match ends the walk (the packet is classified).
const TC_U32_TERMINAL: u8 = 1;

const TCA_ACT_KIND: u16 = 1;
const TCA_ACT_OPTIONS: u16 = 2;
const TCA_MIRRED_PARMS: u16 = 2;

/// The root of a link's egress qdisc tree (`TC_H_ROOT`).
pub const HANDLE_ROOT: u32 = 0xffff_ffff;
/// The parent the ingress qdisc hangs from (`TC_H_INGRESS`).
pub const HANDLE_INGRESS: u32 = 0xffff_fff1;
/// The handle of the ingress qdisc, `ffff:`.
pub const INGRESS_QDISC: u32 = 0xffff_0000;
/// The handle the reference gives its token buckets, `1:`.
pub const TBF_HANDLE: u32 = 0x0001_0000;
/// `ETH_P_ALL`: a filter for every protocol.
pub const ETH_P_ALL: u16 = 0x0003;
/// `TCA_EGRESS_REDIR`: a mirred action that moves the packet to the target's egress.
pub const EGRESS_REDIRECT: i32 = 1;
/// `TC_ACT_OK` (tc's "pass").
pub const ACT_PASS: i32 = 0;
/// `TC_ACT_STOLEN`: the packet is consumed by the action.
pub const ACT_STOLEN: i32 = 4;

/// `struct tcmsg`: family, padding, ifindex, handle, parent, info.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct TcMsg {
    index: u32,
    handle: u32,
    parent: u32,
    /// For a filter: priority in the upper 16 bits, protocol (network order) below.
    info: u32,
}

impl TcMsg {
    const LEN: usize = 20;

    fn write(&self, w: &mut Writer) {
        w.bytes(&[0, 0, 0, 0]);
        w.bytes(&self.index.to_ne_bytes());
        w.bytes(&self.handle.to_ne_bytes());
        w.bytes(&self.parent.to_ne_bytes());
        w.bytes(&self.info.to_ne_bytes());
    }

    fn parse(payload: &[u8]) -> std::result::Result<(Self, &[u8]), Malformed> {
        let h = payload
            .get(..Self::LEN)
            .ok_or(Malformed("truncated tcmsg"))?;
        let at = |i: usize| u32::from_ne_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let msg = Self {
            index: at(4),
            handle: at(8),
            parent: at(12),
            info: at(16),
        };
        Ok((msg, &payload[Self::LEN..]))
    }
}

/// A token bucket as the kernel takes it (`struct tc_tbf_qopt` and its attributes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tbf {
    /// Rate in bytes per second (above `u32::MAX` it travels as `TCA_TBF_RATE64`).
    pub rate: u64,
    /// Queue limit in bytes.
    pub limit: u32,
    /// Bucket size in scheduler ticks (see [`psched_ticks_per_usec`]).
    pub buffer: u32,
    /// `TCA_TBF_BURST`: the bucket in bytes, which makes the kernel compute the
    /// buffer itself. The reference plugin never sends it.
    pub burst: Option<u32>,
    /// `TCA_TBF_RTAB`: a rate table (256 slot times). Kernels since 3.13 ignore it
    /// for a rate spec without link layer, and the reference plugin never sends it.
    pub rate_table: Option<Vec<u32>>,
}

/// A qdisc read back from the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qdisc {
    /// The link it is attached to.
    pub link: u32,
    /// Its handle (`1:` is `0x10000`).
    pub handle: u32,
    /// Its parent ([`HANDLE_ROOT`], [`HANDLE_INGRESS`], or a class).
    pub parent: u32,
    /// `tbf`, `ingress`, `noqueue`, ...
    pub kind: String,
    /// For a `tbf`: its parameters (`burst` and `rate_table` are never reported).
    pub tbf: Option<Tbf>,
}

/// A mirred action of a filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mirred {
    /// [`EGRESS_REDIRECT`], or another `TCA_*_REDIR`/`_MIRROR` code.
    pub direction: i32,
    /// The target link.
    pub target: u32,
    /// What happens to the packet afterwards ([`ACT_STOLEN`], [`ACT_PASS`], ...).
    pub verdict: i32,
}

/// A classifier read back from the kernel (one message of a filter dump; `u32`
/// reports its hash table and each key node as messages of their own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// The link it is attached to.
    pub link: u32,
    /// The qdisc it hangs from.
    pub parent: u32,
    /// Its preference.
    pub priority: u16,
    /// The protocol it matches (host order; [`ETH_P_ALL`] for every one).
    pub protocol: u16,
    /// `u32`, ...
    pub kind: String,
    /// Its handle (for `u32`: hash table, bucket and node).
    pub handle: u32,
    /// `u32`'s class id (`flowid`), if set.
    pub class_id: Option<u32>,
    /// For a `u32` node: whether its selector matches every packet (one key with mask 0).
    pub matches_all: bool,
    /// Its mirred actions, in order.
    pub mirred: Vec<Mirred>,
}

impl Filter {
    /// Whether this filter redirects every packet it sees to `target`'s egress.
    pub fn redirects_all_to(&self, target: u32) -> bool {
        self.matches_all
            && self.mirred.first().is_some_and(|m| {
                m.direction == EGRESS_REDIRECT && m.target == target && m.verdict == ACT_STOLEN
            })
    }
}

/// The scheduler's ticks per microsecond, from `/proc/net/psched` as the reference's
/// netlink library reads it (the tick is 1/64 µs on current kernels: 15.625).
pub fn psched_ticks_per_usec() -> std::io::Result<f64> {
    let text = std::fs::read_to_string("/proc/net/psched")?;
    parse_psched(&text).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unexpected /proc/net/psched: {text:?}"),
        )
    })
}

/// `t2us us2t clock_res ...` in hex; ticks per µs is `t2us / us2t * clock_res / 1e6`.
pub fn parse_psched(text: &str) -> Option<f64> {
    let mut fields = text
        .split_whitespace()
        .map(|f| u32::from_str_radix(f, 16).ok());
    let (t2us, us2t, clock_res) = (fields.next()??, fields.next()??, fields.next()??);
    if us2t == 0 || clock_res == 0 {
        return None;
    }
    let clock_factor = f64::from(clock_res) / 1_000_000.0;
    Some(f64::from(t2us) / f64::from(us2t) * clock_factor)
}

impl Netlink {
    /// Adds a token bucket as `link`'s root qdisc with handle `1:`; fails with
    /// `is_exists()` if the link already has a root qdisc of its own.
    pub fn add_tbf(&self, link: u32, tbf: &Tbf) -> Result<()> {
        self.exec(
            RTM_NEWQDISC,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
            |w| tbf_message(w, link, tbf),
            || format!("create qdisc: tbf on link #{link}"),
        )
    }

    /// Adds the ingress qdisc (`ffff:`) to `link`.
    pub fn add_ingress_qdisc(&self, link: u32) -> Result<()> {
        self.exec(
            RTM_NEWQDISC,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
            |w| ingress_message(w, link),
            || format!("create ingress qdisc on link #{link}"),
        )
    }

    /// Deletes `link`'s qdisc hanging from `parent` ([`HANDLE_ROOT`] or
    /// [`HANDLE_INGRESS`]).
    pub fn delete_qdisc(&self, link: u32, parent: u32) -> Result<()> {
        self.exec(
            RTM_DELQDISC,
            NLM_F_REQUEST | NLM_F_ACK,
            |w| {
                TcMsg {
                    index: link,
                    parent,
                    ..TcMsg::default()
                }
                .write(w);
            },
            || format!("delete qdisc {parent:#x} of link #{link}"),
        )
    }

    /// On `link`'s ingress qdisc, a `u32` filter (preference 1, every protocol,
    /// flowid `1:1`) matching every packet and redirecting it to `target`'s egress.
    pub fn add_redirect_filter(&self, link: u32, target: u32) -> Result<()> {
        self.exec(
            RTM_NEWTFILTER,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
            |w| redirect_filter_message(w, link, target),
            || format!("add filter: redirect from link #{link} to link #{target}"),
        )
    }

    /// Creates an `ifb` device, up, with this MTU and no transmit queue length
    /// (as the reference does).
    pub fn create_ifb(&self, name: &str, mtu: u32) -> Result<()> {
        self.exec(
            RTM_NEWLINK,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
            |w| ifb_message(w, name, mtu),
            || format!("adding link: ifb {name:?}"),
        )
    }

    /// Every qdisc of `link` (a kernel dump covers every link: the others are skipped).
    pub fn qdiscs(&self, link: u32) -> Result<Vec<Qdisc>> {
        self.dump_qdiscs(Some(link))
    }

    /// Every qdisc of every link, in one dump.
    pub fn all_qdiscs(&self) -> Result<Vec<Qdisc>> {
        self.dump_qdiscs(None)
    }

    fn dump_qdiscs(&self, link: Option<u32>) -> Result<Vec<Qdisc>> {
        let mut found = Vec::new();
        self.request(
            RTM_GETQDISC,
            NLM_F_REQUEST | NLM_F_DUMP,
            |w| {
                TcMsg {
                    index: link.unwrap_or(0),
                    ..TcMsg::default()
                }
                .write(w);
            },
            |msg| {
                if msg.ty == RTM_NEWQDISC {
                    let qdisc = parse_qdisc(msg.payload)?;
                    if link.is_none_or(|l| l == qdisc.link) {
                        found.push(qdisc);
                    }
                }
                Ok(())
            },
            || match link {
                Some(link) => format!("failed to list the qdiscs of link #{link}"),
                None => "failed to list qdiscs".to_owned(),
            },
        )?;
        Ok(found)
    }

    /// The filters of `link` hanging from the qdisc with handle `parent`
    /// ([`INGRESS_QDISC`] for the ingress one).
    pub fn filters(&self, link: u32, parent: u32) -> Result<Vec<Filter>> {
        let mut found = Vec::new();
        self.request(
            RTM_GETTFILTER,
            NLM_F_REQUEST | NLM_F_DUMP,
            |w| {
                TcMsg {
                    index: link,
                    parent,
                    ..TcMsg::default()
                }
                .write(w);
            },
            |msg| {
                if msg.ty == RTM_NEWTFILTER {
                    found.push(parse_filter(msg.payload)?);
                }
                Ok(())
            },
            || format!("failed to list the filters of link #{link}"),
        )?;
        Ok(found)
    }
}

/// `struct tc_ratespec` with only the rate set (what the reference sends).
fn rate_spec(w: &mut Writer, rate: u32) {
    // cell_log, linklayer, overhead, cell_align, mpu: all 0.
    w.bytes(&[0; 8]);
    w.bytes(&rate.to_ne_bytes());
}

fn tbf_message(w: &mut Writer, link: u32, tbf: &Tbf) {
    TcMsg {
        index: link,
        handle: TBF_HANDLE,
        parent: HANDLE_ROOT,
        info: 0,
    }
    .write(w);
    w.attr_str(TCA_KIND, "tbf");
    let options = w.nest_start(TCA_OPTIONS);
    let mut qopt = Writer::new();
    // A rate above 32 bits is truncated here and given whole in TCA_TBF_RATE64.
    rate_spec(&mut qopt, tbf.rate as u32);
    rate_spec(&mut qopt, 0); // no peak rate
    qopt.bytes(&tbf.limit.to_ne_bytes());
    qopt.bytes(&tbf.buffer.to_ne_bytes());
    qopt.bytes(&0u32.to_ne_bytes()); // mtu: only for a peak rate
    w.attr(TCA_TBF_PARMS, qopt.as_bytes());
    if let Some(table) = &tbf.rate_table {
        let bytes: Vec<u8> = table.iter().flat_map(|slot| slot.to_ne_bytes()).collect();
        w.attr(TCA_TBF_RTAB, &bytes);
    }
    if tbf.rate > u64::from(u32::MAX) {
        w.attr(TCA_TBF_RATE64, &tbf.rate.to_ne_bytes());
    }
    if let Some(burst) = tbf.burst {
        w.attr_u32(TCA_TBF_BURST, burst);
    }
    w.nest_end(options);
}

fn ingress_message(w: &mut Writer, link: u32) {
    TcMsg {
        index: link,
        handle: INGRESS_QDISC,
        parent: HANDLE_INGRESS,
        info: 0,
    }
    .write(w);
    w.attr_str(TCA_KIND, "ingress");
    let options = w.nest_start(TCA_OPTIONS);
    w.nest_end(options);
}

/// One mirred action at position `order` of an action list.
fn mirred_action(w: &mut Writer, order: u16, mirred: Mirred) {
    let entry = w.nest_start(order);
    w.attr_str(TCA_ACT_KIND, "mirred");
    let options = w.nest_start(TCA_ACT_OPTIONS);
    // struct tc_mirred: tc_gen (index, capab, action, refcnt, bindcnt), eaction, ifindex.
    let mut parms = Writer::new();
    parms.bytes(&[0; 8]);
    parms.bytes(&mirred.verdict.to_ne_bytes());
    parms.bytes(&[0; 8]);
    parms.bytes(&mirred.direction.to_ne_bytes());
    parms.bytes(&mirred.target.to_ne_bytes());
    w.attr(TCA_MIRRED_PARMS, parms.as_bytes());
    w.nest_end(options);
    w.nest_end(entry);
}

fn redirect_filter_message(w: &mut Writer, link: u32, target: u32) {
    TcMsg {
        index: link,
        handle: 0,
        parent: INGRESS_QDISC,
        info: (1 << 16) | u32::from(ETH_P_ALL.swap_bytes()),
    }
    .write(w);
    w.attr_str(TCA_KIND, "u32");
    let options = w.nest_start(TCA_OPTIONS);
    // struct tc_u32_sel: flags, offshift, nkeys, pad, offmask, off, offoff, hoff,
    // hmask; then one key (mask, val, off, offmask) of zeros: matches everything.
    let mut sel = Writer::new();
    sel.bytes(&[TC_U32_TERMINAL, 0, 1, 0]);
    sel.bytes(&[0; 12]);
    sel.bytes(&[0; 16]);
    w.attr(TCA_U32_SEL, sel.as_bytes());
    w.attr_u32(TCA_U32_CLASSID, 0x0001_0001);
    let actions = w.nest_start(TCA_U32_ACT);
    // The reference's library sends its "redirect index" as a first action and the
    // plugin's own mirred action (verdict pass, never reached) as a second one; both
    // are kept so that `tc` shows the same filter whoever made it.
    mirred_action(
        w,
        1,
        Mirred {
            direction: EGRESS_REDIRECT,
            target,
            verdict: ACT_STOLEN,
        },
    );
    mirred_action(
        w,
        2,
        Mirred {
            direction: EGRESS_REDIRECT,
            target,
            verdict: ACT_PASS,
        },
    );
    w.nest_end(actions);
    w.nest_end(options);
}

fn ifb_message(w: &mut Writer, name: &str, mtu: u32) {
    IfInfo {
        flags: IFF_UP,
        change: IFF_UP,
        ..IfInfo::default()
    }
    .write(w);
    w.attr_str(IFLA_IFNAME, name);
    w.attr_u32(IFLA_MTU, mtu);
    w.attr_u32(IFLA_TXQLEN, 0);
    let info = w.nest_start(IFLA_LINKINFO);
    w.attr(IFLA_INFO_KIND, b"ifb");
    w.nest_end(info);
}

fn u64_ne(v: &[u8]) -> std::result::Result<u64, Malformed> {
    Ok(u64::from_ne_bytes(v.try_into().map_err(|_| {
        Malformed("u64 attribute of another length")
    })?))
}

fn i32_at(v: &[u8], at: usize) -> std::result::Result<i32, Malformed> {
    let bytes = v
        .get(at..at + 4)
        .ok_or(Malformed("truncated traffic control structure"))?;
    Ok(i32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

fn parse_tbf(options: &[u8]) -> std::result::Result<Tbf, Malformed> {
    let mut tbf = Tbf {
        rate: 0,
        limit: 0,
        buffer: 0,
        burst: None,
        rate_table: None,
    };
    let mut rate64 = None;
    for attr in attrs(options) {
        let (ty, v) = attr?;
        match ty {
            TCA_TBF_PARMS => {
                if v.len() < 36 {
                    return Err(Malformed("truncated tc_tbf_qopt"));
                }
                tbf.rate = u64::from(i32_at(v, 8)? as u32);
                tbf.limit = i32_at(v, 24)? as u32;
                tbf.buffer = i32_at(v, 28)? as u32;
            }
            TCA_TBF_RATE64 => rate64 = Some(u64_ne(v)?),
            _ => {}
        }
    }
    if let Some(rate) = rate64 {
        tbf.rate = rate;
    }
    Ok(tbf)
}

pub(super) fn parse_qdisc(payload: &[u8]) -> std::result::Result<Qdisc, Malformed> {
    let (header, rest) = TcMsg::parse(payload)?;
    let mut kind = String::new();
    let mut options: &[u8] = &[];
    for attr in attrs(rest) {
        let (ty, v) = attr?;
        match ty {
            TCA_KIND => kind = c_string(v),
            TCA_OPTIONS => options = v,
            _ => {}
        }
    }
    let tbf = if kind == "tbf" {
        Some(parse_tbf(options)?)
    } else {
        None
    };
    Ok(Qdisc {
        link: header.index,
        handle: header.handle,
        parent: header.parent,
        kind,
        tbf,
    })
}

fn parse_mirred(action: &[u8]) -> std::result::Result<Option<Mirred>, Malformed> {
    let mut kind = String::new();
    let mut parms = None;
    for attr in attrs(action) {
        let (ty, v) = attr?;
        match ty {
            TCA_ACT_KIND => kind = c_string(v),
            TCA_ACT_OPTIONS => {
                for inner in attrs(v) {
                    let (ty, v) = inner?;
                    if ty == TCA_MIRRED_PARMS {
                        parms = Some(v);
                    }
                }
            }
            _ => {}
        }
    }
    match (kind.as_str(), parms) {
        ("mirred", Some(p)) => Ok(Some(Mirred {
            verdict: i32_at(p, 8)?,
            direction: i32_at(p, 20)?,
            target: i32_at(p, 24)? as u32,
        })),
        _ => Ok(None),
    }
}

/// Whether a `tc_u32_sel` holds exactly one key with mask 0 (every packet matches).
fn selects_all(sel: &[u8]) -> bool {
    sel.len() >= 32 && sel[2] == 1 && sel[16..20] == [0; 4]
}

pub(super) fn parse_filter(payload: &[u8]) -> std::result::Result<Filter, Malformed> {
    let (header, rest) = TcMsg::parse(payload)?;
    let mut filter = Filter {
        link: header.index,
        parent: header.parent,
        priority: (header.info >> 16) as u16,
        protocol: (header.info as u16).swap_bytes(),
        kind: String::new(),
        handle: header.handle,
        class_id: None,
        matches_all: false,
        mirred: Vec::new(),
    };
    for attr in attrs(rest) {
        let (ty, v) = attr?;
        match ty {
            TCA_KIND => filter.kind = c_string(v),
            TCA_OPTIONS => {
                for option in attrs(v) {
                    let (ty, v) = option?;
                    match ty {
                        TCA_U32_CLASSID => filter.class_id = Some(u32_ne(v)?),
                        TCA_U32_SEL => filter.matches_all = selects_all(v),
                        TCA_U32_ACT => {
                            for action in attrs(v) {
                                let (_, v) = action?;
                                if let Some(m) = parse_mirred(v)? {
                                    filter.mirred.push(m);
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if filter.kind != "u32" {
        filter.matches_all = false;
    }
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use cni_netlink::messages;

    use super::*;
    use crate::netlink::tests::{hex, message};

    fn payload(bytes: &[u8]) -> Vec<u8> {
        messages(bytes).next().unwrap().unwrap().payload.to_vec()
    }

    #[test]
    fn a_tbf_request_is_laid_out_as_the_reference_sends_it() {
        let tbf = Tbf {
            rate: 1_000_000,
            limit: 35_000,
            buffer: 156_250,
            burst: None,
            rate_table: None,
        };
        let bytes = message(RTM_NEWQDISC, 0, |w| tbf_message(w, 7, &tbf));
        let want = hex("00000000 07000000 00000100 ffffffff 00000000
             0800 0100 74626600
             2c00 0200
               2800 0100
                 00000000 00000000 40420f00
                 00000000 00000000 00000000
                 b8880000 5a620200 00000000");
        assert_eq!(payload(&bytes), want);
        let parsed = parse_qdisc(&want).unwrap();
        assert_eq!(parsed.kind, "tbf");
        assert_eq!(
            (parsed.link, parsed.handle, parsed.parent),
            (7, 0x10000, HANDLE_ROOT)
        );
        assert_eq!(parsed.tbf, Some(tbf));
    }

    #[test]
    fn a_rate_above_32_bits_travels_as_rate64_and_burst_and_rtab_when_asked() {
        let tbf = Tbf {
            rate: 5_000_000_000,
            limit: 1,
            buffer: 2,
            burst: Some(3),
            rate_table: Some(vec![9; 256]),
        };
        let bytes = message(RTM_NEWQDISC, 0, |w| tbf_message(w, 1, &tbf));
        let p = payload(&bytes);
        let (_, rest) = TcMsg::parse(&p).unwrap();
        let top: Vec<_> = attrs(rest).map(|a| a.unwrap()).collect();
        let options: Vec<_> = attrs(top[1].1).map(|a| a.unwrap()).collect();
        let types: Vec<u16> = options.iter().map(|(t, _)| *t).collect();
        assert_eq!(
            types,
            [TCA_TBF_PARMS, TCA_TBF_RTAB, TCA_TBF_RATE64, TCA_TBF_BURST]
        );
        assert_eq!(options[1].1.len(), 1024);
        assert_eq!(options[2].1, 5_000_000_000u64.to_ne_bytes());
        assert_eq!(options[3].1, 3u32.to_ne_bytes());
        // The 32-bit rate is the truncation; the parser prefers the 64-bit one.
        assert_eq!(
            u32_ne(&options[0].1[8..12]).unwrap(),
            5_000_000_000u64 as u32
        );
        let parsed = parse_qdisc(&p).unwrap().tbf.unwrap();
        assert_eq!(
            (parsed.rate, parsed.limit, parsed.buffer),
            (5_000_000_000, 1, 2)
        );
    }

    #[test]
    fn the_ingress_qdisc_and_the_ifb_requests() {
        let bytes = message(RTM_NEWQDISC, 0, |w| ingress_message(w, 3));
        assert_eq!(
            payload(&bytes),
            hex("00000000 03000000 0000ffff f1ffffff 00000000
                 0c00 0100 696e6772 65737300
                 0400 0200")
        );
        let bytes = message(RTM_NEWLINK, 0, |w| ifb_message(w, "bwp1", 1400));
        assert_eq!(
            payload(&bytes),
            hex("00000000 00000000 01000000 01000000
                 0900 0300 62777031 00000000
                 0800 0400 78050000
                 0800 0d00 00000000
                 0c00 1200 0700 0100 69666200")
        );
    }

    #[test]
    fn the_redirect_filter_round_trips() {
        let bytes = message(RTM_NEWTFILTER, 0, |w| redirect_filter_message(w, 4, 9));
        let p = payload(&bytes);
        let mirred = |order: &str, verdict: &str| {
            format!(
                "3400 {order}
                   0b00 0100 6d697272 65640000
                   2400 0200
                     2000 0200 00000000 00000000 {verdict} 00000000 00000000
                               01000000 09000000"
            )
        };
        let want = hex(&format!(
            "00000000 04000000 00000000 0000ffff 00030100
             0800 0100 75333200
             9c00 0200
               2400 0500 01000100 00000000 00000000 00000000
                         00000000 00000000 00000000 00000000
               0800 0100 01000100
               6c00 0700 {} {}",
            mirred("0100", "04000000"),
            mirred("0200", "00000000")
        ));
        assert_eq!(p, want);
        let filter = parse_filter(&p).unwrap();
        assert_eq!(filter.kind, "u32");
        assert_eq!((filter.priority, filter.protocol), (1, ETH_P_ALL));
        assert_eq!(filter.class_id, Some(0x10001));
        assert!(filter.matches_all);
        assert!(filter.redirects_all_to(9));
        assert!(!filter.redirects_all_to(8));
        assert_eq!(filter.mirred.len(), 2);
        assert_eq!(filter.mirred[1].verdict, ACT_PASS);
    }

    #[test]
    fn psched_is_read_as_the_reference_reads_it() {
        assert_eq!(
            parse_psched("000003e8 00000040 000f4240 3b9aca00\n"),
            Some(15.625)
        );
        assert_eq!(
            parse_psched("00000001 00000001 3b9aca00 3b9aca00"),
            Some(1000.0)
        );
        assert_eq!(parse_psched("1 0 1"), None);
        assert_eq!(parse_psched("zz"), None);
        assert_eq!(parse_psched(""), None);
    }

    #[test]
    fn truncated_and_corrupted_replies_are_errors_never_panics() {
        let tbf = Tbf {
            rate: 5_000_000_000,
            limit: 1,
            buffer: 2,
            burst: None,
            rate_table: None,
        };
        let q = payload(&message(RTM_NEWQDISC, 0, |w| tbf_message(w, 1, &tbf)));
        let f = payload(&message(RTM_NEWTFILTER, 0, |w| {
            redirect_filter_message(w, 4, 9)
        }));
        for cut in 0..q.len() {
            let _ = parse_qdisc(&q[..cut]);
        }
        for cut in 0..f.len() {
            let _ = parse_filter(&f[..cut]);
        }
        assert!(parse_qdisc(&q[..10]).is_err());
        for at in 0..f.len() {
            for value in [0x00, 0x03, 0x81, 0xff] {
                let mut bytes = f.clone();
                bytes[at] = value;
                let _ = parse_filter(&bytes);
                let _ = parse_qdisc(&bytes);
            }
        }
    }
}

//! WireGuard devices: the link itself through rtnetlink ([`Netlink::create_wireguard`],
//! kind `wireguard`), and its keys, port and peers through the kernel's `wireguard`
//! generic netlink family ([`Wireguard`]), as `wg` (wireguard-tools) speaks it. No
//! subprocess, no C library.
//!
//! The family has two commands. `WG_CMD_GET_DEVICE` is a dump: the device's settings
//! in its first message, then its peers, as many as fit in each message; a peer whose
//! allowed IPs do not fit is cut, and the next message carries it again (its public key
//! and the rest of its allowed IPs), which [`Wireguard::device`] joins back into one
//! peer. `WG_CMD_SET_DEVICE` changes what it names and leaves the rest: a device
//! setting, or one peer at a time, each with its flags (`WGPEER_F_REMOVE_ME`;
//! `WGPEER_F_REPLACE_ALLOWEDIPS`, replacing the peer's allowed IPs by the list in the
//! same message, inside one request; `WGPEER_F_UPDATE_ONLY`, never creating the peer).
//!
//! A change larger than one request is cut as wireguard-tools cuts it, with one
//! difference that keeps replacements whole: a peer that does not fit in what is left
//! of a request starts the next one, and only a peer whose allowed IPs alone exceed a
//! request (about 1,600 IPv6 or 2,300 IPv4 prefixes) is cut, its later parts adding
//! (with `WGPEER_F_UPDATE_ONLY`) to what the first part replaced.
//!
//! A device's number and name are per network namespace: a [`Wireguard`] handle talks
//! to the namespace its socket was opened in ([`Wireguard::open_in`]).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::ops::Range;
use std::time::{Duration, SystemTime};

use cni_netlink::wire::{
    NLA_F_NESTED, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_EXCL, NLM_F_REQUEST,
    NLMSG_HDRLEN, attrs, u8_value, u16_ne, u32_ne,
};
use cni_netlink::{Malformed, Socket, Writer};
use ipnetwork::IpNetwork;
use nix::errno::Errno;

use super::Netlink;
use super::genl::{self, GENL_HDRLEN, NETLINK_GENERIC};
use super::rtnl::{IFLA_IFNAME, IFLA_INFO_KIND, IFLA_LINKINFO, IFLA_MTU, IfInfo, RTM_NEWLINK};
use crate::error::{Error, Result, source_errno};
use crate::netns::NetNs;

/// A Curve25519 key as WireGuard uses it: 32 bytes, private or public.
pub type WgKey = [u8; 32];

/// What WireGuard adds to an inner packet over an IPv4 underlay: outer IPv4 (20), UDP
/// (8) and WireGuard's data header and authentication tag (32). The device's MTU is the
/// uplink's minus this.
pub const OVERHEAD_V4: u32 = 60;

/// The same over an IPv6 underlay, whose header is 40 bytes.
pub const OVERHEAD_V6: u32 = 80;

/// The generic netlink family's name and version (`WG_GENL_NAME`, `WG_GENL_VERSION`).
const FAMILY_NAME: &str = "wireguard";
const FAMILY_VERSION: u8 = 1;

const WG_CMD_GET_DEVICE: u8 = 0;
const WG_CMD_SET_DEVICE: u8 = 1;

// Device attributes (WGDEVICE_A_*).
const WGDEVICE_A_IFINDEX: u16 = 1;
const WGDEVICE_A_IFNAME: u16 = 2;
const WGDEVICE_A_PRIVATE_KEY: u16 = 3;
const WGDEVICE_A_PUBLIC_KEY: u16 = 4;
const WGDEVICE_A_LISTEN_PORT: u16 = 6;
const WGDEVICE_A_FWMARK: u16 = 7;
const WGDEVICE_A_PEERS: u16 = 8;

// Peer attributes (WGPEER_A_*) and flags (WGPEER_F_*).
const WGPEER_A_PUBLIC_KEY: u16 = 1;
const WGPEER_A_FLAGS: u16 = 3;
const WGPEER_A_ENDPOINT: u16 = 4;
const WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL: u16 = 5;
const WGPEER_A_LAST_HANDSHAKE_TIME: u16 = 6;
const WGPEER_A_RX_BYTES: u16 = 7;
const WGPEER_A_TX_BYTES: u16 = 8;
const WGPEER_A_ALLOWEDIPS: u16 = 9;
const WGPEER_F_REMOVE_ME: u32 = 1 << 0;
const WGPEER_F_REPLACE_ALLOWEDIPS: u32 = 1 << 1;
const WGPEER_F_UPDATE_ONLY: u32 = 1 << 2;

// Allowed IP attributes (WGALLOWEDIP_A_*).
const WGALLOWEDIP_A_FAMILY: u16 = 1;
const WGALLOWEDIP_A_IPADDR: u16 = 2;
const WGALLOWEDIP_A_CIDR_MASK: u16 = 3;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
/// `sizeof(struct sockaddr_in)` and `sizeof(struct sockaddr_in6)`.
const SOCKADDR_IN_LEN: usize = 16;
const SOCKADDR_IN6_LEN: usize = 28;

/// The largest SET_DEVICE request sent: every nest's length is 16 bits, so a request's
/// peers (one nest) must stay under 64 KiB. The kernel takes requests up to the
/// socket's send buffer (over 200 KiB by default).
const MESSAGE_BUDGET: usize = 65_000;

/// How often a dump that overlapped a change of the device (`NLM_F_DUMP_INTR`: peers
/// added or removed while it ran) is started again before giving up.
const DUMP_ATTEMPTS: usize = 10;

/// One peer as [`Wireguard::set_peer`] sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgPeerConfig {
    /// The peer's public key, which names it.
    pub public_key: WgKey,
    /// Where to send to it. `None` leaves the endpoint the device has (none for a new
    /// peer, which then learns it from the peer's first authenticated packet): the
    /// kernel has no way to clear one.
    pub endpoint: Option<SocketAddr>,
    /// The prefixes the peer may send from and is sent to: they replace the peer's
    /// whole list. Host bits are cleared (the kernel stores prefixes).
    pub allowed_ips: Vec<IpNetwork>,
    /// Seconds between keepalives; `None` (or 0) turns them off.
    pub persistent_keepalive: Option<u16>,
}

/// One peer as the kernel reports it ([`WgDevice::peers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgPeer {
    /// The peer's public key.
    pub public_key: WgKey,
    /// Where the device sends to it: as set, or learned from its last packet.
    pub endpoint: Option<SocketAddr>,
    /// Its allowed IPs, in the kernel's order.
    pub allowed_ips: Vec<IpNetwork>,
    /// When the last handshake with it completed (wall clock); `None` if never.
    pub last_handshake: Option<SystemTime>,
    /// Bytes received from it.
    pub rx_bytes: u64,
    /// Bytes sent to it.
    pub tx_bytes: u64,
}

/// A WireGuard device's settings and peers ([`Wireguard::device`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WgDevice {
    /// Interface index.
    pub ifindex: u32,
    /// The device's public key; `None` until it has a private key.
    pub public_key: Option<WgKey>,
    /// Whether it has a private key (which is never read back out of the kernel's
    /// answer into this struct).
    pub has_private_key: bool,
    /// UDP port it listens on (the kernel's choice if it was set to 0, once up).
    pub listen_port: u16,
    /// Firewall mark of the packets it sends; 0 for none.
    pub fwmark: u32,
    /// Its peers, in the kernel's order.
    pub peers: Vec<WgPeer>,
}

/// A generic netlink socket that speaks the `wireguard` family, in the network
/// namespace it was opened in.
#[derive(Debug)]
pub struct Wireguard {
    sock: Socket,
    family: u16,
}

impl Wireguard {
    /// Opens a handle in the calling thread's network namespace; [`Error::NoWireguard`]
    /// if the kernel has no WireGuard (built without it, or its module cannot load).
    pub fn open() -> Result<Wireguard> {
        let sock = Socket::open(NETLINK_GENERIC).map_err(|source| Error::Connect { source })?;
        Self::resolve(sock)
    }

    /// Opens a handle that talks to the devices of `netns`, without moving the
    /// calling thread (the socket is created on a short-lived thread inside it).
    pub fn open_in(netns: &NetNs) -> Result<Wireguard> {
        let sock = netns
            .run(|| Socket::open(NETLINK_GENERIC))?
            .map_err(|source| Error::Connect { source })?;
        Self::resolve(sock)
    }

    fn resolve(mut sock: Socket) -> Result<Wireguard> {
        match genl::resolve(&mut sock, FAMILY_NAME) {
            Ok(family) => Ok(Self { sock, family }),
            Err(e) if e.errno() == Some(Errno::ENOENT as i32) => Err(Error::NoWireguard {
                source: io::Error::from_raw_os_error(Errno::ENOENT as i32),
            }),
            Err(e) => Err(Error::netlink(
                "failed to look up the generic netlink family \"wireguard\"",
                e,
            )),
        }
    }

    /// The device `ifname` with all its peers (a dump, joined from as many messages as
    /// the kernel sends). A missing link is `is_not_found()`; a link of another kind is
    /// refused with `EOPNOTSUPP`.
    pub fn device(&mut self, ifname: &str) -> Result<WgDevice> {
        for _ in 0..DUMP_ATTEMPTS {
            if let Some(device) = self.device_once(ifname)? {
                return Ok(device);
            }
        }
        Err(changed_during_each_dump(ifname))
    }

    /// [`Wireguard::device`], given up as soon as `give_up` says so (it is asked before
    /// each message of the kernel's answer is decoded): `Ok(None)` then. A handle that
    /// gave up still has the rest of that dump before it: drop it. Closing it ends the
    /// dump without the kernel making the rest, which at thousands of peers is most of
    /// the read; a request on it would first read all of the rest, or fail (`EBUSY`).
    pub fn device_unless(
        &mut self,
        ifname: &str,
        give_up: impl Fn() -> bool,
    ) -> Result<Option<WgDevice>> {
        for _ in 0..DUMP_ATTEMPTS {
            match self.dump(ifname, &give_up)? {
                Dump::Device(device) => return Ok(Some(device)),
                Dump::GaveUp => return Ok(None),
                Dump::Changed => {}
            }
        }
        Err(changed_during_each_dump(ifname))
    }

    /// One dump of the device, as [`Wireguard::device`] makes it: `None` when the device
    /// changed while it ran (`NLM_F_DUMP_INTR`). A dump returned is the device as it was
    /// throughout the dump, so a change it shows was made before the dump began.
    pub fn device_once(&mut self, ifname: &str) -> Result<Option<WgDevice>> {
        match self.dump(ifname, || false)? {
            Dump::Device(device) => Ok(Some(device)),
            Dump::Changed | Dump::GaveUp => Ok(None),
        }
    }

    fn dump(&mut self, ifname: &str, give_up: impl Fn() -> bool) -> Result<Dump> {
        let context = || format!("failed to read WireGuard device {ifname:?}");
        let mut w = Writer::new();
        let start = w.begin_msg(
            self.family,
            NLM_F_REQUEST | NLM_F_DUMP,
            self.sock.next_seq(),
        );
        get_device(&mut w, ifname);
        w.end_msg(start);
        let family = self.family;
        let mut device = WgDevice::default();
        let mut bad = None;
        let mut interrupted = false;
        let whole = self
            .sock
            .request_while(w.as_bytes(), &mut |msg| {
                if give_up() {
                    return false;
                }
                if msg.ty != family {
                    return true;
                }
                interrupted |= msg.flags & NLM_F_DUMP_INTR != 0;
                if bad.is_none() {
                    bad = add_dump_message(&mut device, msg.payload).err();
                }
                true
            })
            .map_err(|e| Error::netlink(context(), e))?;
        // Given up first: whatever was decoded, the caller must drop the handle.
        if !whole {
            return Ok(Dump::GaveUp);
        }
        if let Some(malformed) = bad {
            return Err(Error::netlink(context(), malformed.into()));
        }
        Ok(if interrupted {
            Dump::Changed
        } else {
            Dump::Device(device)
        })
    }

    /// Sets the device's private key, listen port (0: the kernel picks one) and
    /// firewall mark (0: none); its peers are left as they are (but a peer whose public
    /// key is the device's new one is dropped by the kernel).
    pub fn set_device(
        &mut self,
        ifname: &str,
        private_key: &WgKey,
        listen_port: u16,
        fwmark: u32,
    ) -> Result<()> {
        let settings = DeviceSettings {
            private_key,
            listen_port,
            fwmark,
        };
        self.set(ifname, Some(&settings), &[], || {
            format!("failed to set the key, port {listen_port} and mark {fwmark:#x} of WireGuard device {ifname:?}")
        })
    }

    /// Adds the peer, or updates it in place: its endpoint (when given), keepalive
    /// and allowed IPs, which replace its list within one request (see the module for
    /// lists too long for one). Other peers are left as they are; an allowed IP
    /// another peer had moves to this one.
    pub fn set_peer(&mut self, ifname: &str, peer: &WgPeerConfig) -> Result<()> {
        self.set(ifname, None, &[PeerChange::Set(peer)], || {
            format!(
                "failed to set peer {} of WireGuard device {ifname:?}",
                key_text(&peer.public_key)
            )
        })
    }

    /// [`Wireguard::set_peer`] for many peers, in as few requests as they fit in (about
    /// 400 peers with an endpoint and one IPv4 and one IPv6 prefix each per request).
    pub fn set_peers(&mut self, ifname: &str, peers: &[WgPeerConfig]) -> Result<()> {
        let changes: Vec<PeerChange<'_>> = peers.iter().map(PeerChange::Set).collect();
        self.set(ifname, None, &changes, || {
            format!(
                "failed to set {} peers of WireGuard device {ifname:?}",
                peers.len()
            )
        })
    }

    /// Removes the peer; a peer the device does not have is no error.
    pub fn remove_peer(&mut self, ifname: &str, public_key: &WgKey) -> Result<()> {
        self.set(ifname, None, &[PeerChange::Remove(public_key)], || {
            format!(
                "failed to remove peer {} of WireGuard device {ifname:?}",
                key_text(public_key)
            )
        })
    }

    /// Sends the SET_DEVICE requests that make the change, one after the other,
    /// stopping at the first refusal.
    fn set(
        &mut self,
        ifname: &str,
        device: Option<&DeviceSettings<'_>>,
        changes: &[PeerChange<'_>],
        context: impl Fn() -> String,
    ) -> Result<()> {
        for mut msg in set_messages(self.family, ifname, device, changes, MESSAGE_BUDGET) {
            let seq = self.sock.next_seq();
            // The sequence number: bytes 8..12 of the netlink header.
            msg[8..12].copy_from_slice(&seq.to_ne_bytes());
            let answer = self.sock.request(&msg, |_| {});
            // A private key should not outlive its request in freed memory.
            msg.fill(0);
            answer.map_err(|e| Error::netlink(context(), e))?;
        }
        Ok(())
    }
}

impl Netlink {
    /// Creates a WireGuard device, down, with `mtu` (the kernel's default is 1420,
    /// right for a 1500-byte IPv6 uplink). A taken name fails with `is_exists()`; a
    /// kernel without WireGuard with [`Error::NoWireguard`].
    pub fn create_wireguard(&self, name: &str, mtu: Option<u32>) -> Result<()> {
        self.exec(
            RTM_NEWLINK,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE,
            |w| wireguard_link_message(w, name, mtu),
            || format!("failed to create WireGuard device {name:?}"),
        )
        .map_err(|e| match e {
            // "Unknown device type": no such link kind, even after trying its module.
            Error::Netlink { source, .. }
                if source_errno(&source) == Some(Errno::EOPNOTSUPP as i32) =>
            {
                Error::NoWireguard { source }
            }
            other => other,
        })
    }
}

/// What `ip link add <name> mtu <mtu> type wireguard` sends.
fn wireguard_link_message(w: &mut Writer, name: &str, mtu: Option<u32>) {
    IfInfo::default().write(w);
    if let Some(mtu) = mtu {
        w.attr_u32(IFLA_MTU, mtu);
    }
    w.attr_str(IFLA_IFNAME, name);
    let info = w.nest_start(IFLA_LINKINFO);
    w.attr(IFLA_INFO_KIND, b"wireguard");
    w.nest_end(info);
}

/// A key for messages: its first bytes in hex, enough to tell peers apart in a log.
fn key_text(key: &WgKey) -> String {
    let head: String = key[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{head}…")
}

/// The GET_DEVICE request's body: the device by name.
fn get_device(w: &mut Writer, ifname: &str) {
    genl::header(w, WG_CMD_GET_DEVICE, FAMILY_VERSION);
    w.attr_str(WGDEVICE_A_IFNAME, ifname);
}

/// The device settings of a SET_DEVICE request.
#[derive(Debug, Clone, Copy)]
struct DeviceSettings<'a> {
    private_key: &'a WgKey,
    listen_port: u16,
    fwmark: u32,
}

/// One peer's part of a SET_DEVICE request.
#[derive(Debug, Clone, Copy)]
enum PeerChange<'a> {
    /// Add or update the peer, replacing its allowed IPs.
    Set(&'a WgPeerConfig),
    /// Remove the peer.
    Remove(&'a WgKey),
}

impl PeerChange<'_> {
    fn allowed_ips(&self) -> &[IpNetwork] {
        match self {
            Self::Set(peer) => &peer.allowed_ips,
            Self::Remove(_) => &[],
        }
    }

    /// Bytes of the peer's nest without its allowed IPs: its first part (`first`,
    /// with its flags, endpoint and keepalive) or a later one (key and flags), and
    /// the allowed IPs' nest header when there are some (`with_ips`).
    fn head_len(&self, first: bool, with_ips: bool) -> usize {
        let mut len = NEST_HEADER + attr_len(32) + attr_len(4);
        if let (Self::Set(peer), true) = (self, first) {
            len += peer.endpoint.map_or(0, |e| attr_len(sockaddr_len(e)));
            len += attr_len(2);
        }
        if with_ips {
            len += NEST_HEADER;
        }
        len
    }
}

/// Length of a nest's or an attribute's header.
const NEST_HEADER: usize = 4;

/// Bytes an attribute with a `value_len`-byte value takes, padded.
const fn attr_len(value_len: usize) -> usize {
    (NEST_HEADER + value_len).next_multiple_of(4)
}

/// Bytes of one allowed IP's nest: family, address, prefix length.
fn allowed_ip_len(net: &IpNetwork) -> usize {
    let address = if net.is_ipv4() { 4 } else { 16 };
    NEST_HEADER + attr_len(2) + attr_len(address) + attr_len(1)
}

fn sockaddr_len(endpoint: SocketAddr) -> usize {
    match endpoint {
        SocketAddr::V4(_) => SOCKADDR_IN_LEN,
        SocketAddr::V6(_) => SOCKADDR_IN6_LEN,
    }
}

/// One peer's share of one request: the change, whether it is its first part, and
/// which of its allowed IPs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Part {
    change: usize,
    first: bool,
    ips: Range<usize>,
}

/// Cuts a SET_DEVICE change into requests of at most `budget` bytes: the device
/// settings in the first, every peer whole in one request when it fits in one, a
/// peer's allowed IPs across requests only when they alone exceed one.
fn plan(ifname: &str, device: bool, changes: &[PeerChange<'_>], budget: usize) -> Vec<Vec<Part>> {
    let empty = NLMSG_HDRLEN + GENL_HDRLEN + attr_len(ifname.len() + 1) + NEST_HEADER;
    let settings = attr_len(32) + attr_len(2) + attr_len(4);
    let mut requests = Vec::new();
    let mut current: Vec<Part> = Vec::new();
    let mut used = empty + if device { settings } else { 0 };
    for (index, change) in changes.iter().enumerate() {
        let ips = change.allowed_ips();
        let whole =
            change.head_len(true, !ips.is_empty()) + ips.iter().map(allowed_ip_len).sum::<usize>();
        if used + whole > budget && !current.is_empty() {
            requests.push(std::mem::take(&mut current));
            used = empty;
        }
        if used + whole <= budget {
            current.push(Part {
                change: index,
                first: true,
                ips: 0..ips.len(),
            });
            used += whole;
            continue;
        }
        // Too big for a request of its own: its allowed IPs go in parts (a budget
        // below a peer without any gets the peer whole, over budget).
        if ips.is_empty() {
            current.push(Part {
                change: index,
                first: true,
                ips: 0..0,
            });
            used += whole;
            continue;
        }
        let mut start = 0;
        let mut first = true;
        loop {
            let mut len = used + change.head_len(first, true);
            let mut end = start;
            while end < ips.len() && len + allowed_ip_len(&ips[end]) <= budget {
                len += allowed_ip_len(&ips[end]);
                end += 1;
            }
            if end == start {
                // A budget below one prefix: one per request rather than none.
                len += allowed_ip_len(&ips[end]);
                end += 1;
            }
            current.push(Part {
                change: index,
                first,
                ips: start..end,
            });
            used = len;
            if end == ips.len() {
                break;
            }
            requests.push(std::mem::take(&mut current));
            used = empty;
            start = end;
            first = false;
        }
    }
    if !current.is_empty() || requests.is_empty() {
        requests.push(current);
    }
    requests
}

/// The SET_DEVICE requests (sequence number 0, to be numbered) that make `changes`
/// (and set `device`), each at most `budget` bytes.
fn set_messages(
    family: u16,
    ifname: &str,
    device: Option<&DeviceSettings<'_>>,
    changes: &[PeerChange<'_>],
    budget: usize,
) -> Vec<Vec<u8>> {
    plan(ifname, device.is_some(), changes, budget)
        .iter()
        .enumerate()
        .map(|(n, parts)| {
            let mut w = Writer::new();
            let start = w.begin_msg(family, NLM_F_REQUEST | NLM_F_ACK, 0);
            genl::header(&mut w, WG_CMD_SET_DEVICE, FAMILY_VERSION);
            w.attr_str(WGDEVICE_A_IFNAME, ifname);
            if let (0, Some(device)) = (n, device) {
                w.attr(WGDEVICE_A_PRIVATE_KEY, device.private_key);
                w.attr_u16(WGDEVICE_A_LISTEN_PORT, device.listen_port);
                w.attr_u32(WGDEVICE_A_FWMARK, device.fwmark);
            }
            if !parts.is_empty() {
                let peers = w.nest_start(WGDEVICE_A_PEERS | NLA_F_NESTED);
                for part in parts {
                    write_peer(&mut w, &changes[part.change], part);
                }
                w.nest_end(peers);
            }
            w.end_msg(start);
            w.into_bytes()
        })
        .collect()
}

/// One peer's nest, in wireguard-tools' order: key, flags, endpoint, keepalive,
/// allowed IPs.
fn write_peer(w: &mut Writer, change: &PeerChange<'_>, part: &Part) {
    let nest = w.nest_start(NLA_F_NESTED);
    match change {
        PeerChange::Remove(key) => {
            w.attr(WGPEER_A_PUBLIC_KEY, &key[..]);
            w.attr_u32(WGPEER_A_FLAGS, WGPEER_F_REMOVE_ME);
        }
        PeerChange::Set(peer) => {
            w.attr(WGPEER_A_PUBLIC_KEY, &peer.public_key);
            if part.first {
                w.attr_u32(WGPEER_A_FLAGS, WGPEER_F_REPLACE_ALLOWEDIPS);
                if let Some(endpoint) = peer.endpoint {
                    w.attr(WGPEER_A_ENDPOINT, &sockaddr(endpoint));
                }
                w.attr_u16(
                    WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL,
                    peer.persistent_keepalive.unwrap_or(0),
                );
            } else {
                // A later part adds to what the first replaced, and never brings back
                // a peer removed in between.
                w.attr_u32(WGPEER_A_FLAGS, WGPEER_F_UPDATE_ONLY);
            }
            let ips = &peer.allowed_ips[part.ips.clone()];
            if !ips.is_empty() {
                let list = w.nest_start(WGPEER_A_ALLOWEDIPS | NLA_F_NESTED);
                for net in ips {
                    write_allowed_ip(w, net);
                }
                w.nest_end(list);
            }
        }
    }
    w.nest_end(nest);
}

fn write_allowed_ip(w: &mut Writer, net: &IpNetwork) {
    let nest = w.nest_start(NLA_F_NESTED);
    match net.network() {
        IpAddr::V4(ip) => {
            w.attr_u16(WGALLOWEDIP_A_FAMILY, AF_INET);
            w.attr(WGALLOWEDIP_A_IPADDR, &ip.octets());
        }
        IpAddr::V6(ip) => {
            w.attr_u16(WGALLOWEDIP_A_FAMILY, AF_INET6);
            w.attr(WGALLOWEDIP_A_IPADDR, &ip.octets());
        }
    }
    w.attr_u8(WGALLOWEDIP_A_CIDR_MASK, net.prefix());
    w.nest_end(nest);
}

/// `struct sockaddr_in` or `struct sockaddr_in6`: family in host order, port, flow
/// information and address in network order, scope in host order.
fn sockaddr(endpoint: SocketAddr) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(SOCKADDR_IN6_LEN);
    match endpoint {
        SocketAddr::V4(a) => {
            bytes.extend_from_slice(&AF_INET.to_ne_bytes());
            bytes.extend_from_slice(&a.port().to_be_bytes());
            bytes.extend_from_slice(&a.ip().octets());
            bytes.resize(SOCKADDR_IN_LEN, 0);
        }
        SocketAddr::V6(a) => {
            bytes.extend_from_slice(&AF_INET6.to_ne_bytes());
            bytes.extend_from_slice(&a.port().to_be_bytes());
            bytes.extend_from_slice(&a.flowinfo().to_be_bytes());
            bytes.extend_from_slice(&a.ip().octets());
            bytes.extend_from_slice(&a.scope_id().to_ne_bytes());
        }
    }
    bytes
}

fn parse_sockaddr(v: &[u8]) -> std::result::Result<SocketAddr, Malformed> {
    let family = u16_ne(v.get(..2).ok_or(Malformed("truncated endpoint"))?)?;
    let port = |v: &[u8]| u16::from_be_bytes([v[2], v[3]]);
    match family {
        AF_INET if v.len() >= SOCKADDR_IN_LEN => {
            let ip = Ipv4Addr::new(v[4], v[5], v[6], v[7]);
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, port(v))))
        }
        AF_INET6 if v.len() >= SOCKADDR_IN6_LEN => {
            let flowinfo = u32::from_be_bytes([v[4], v[5], v[6], v[7]]);
            let octets: [u8; 16] = v[8..24].try_into().map_err(|_| Malformed("endpoint"))?;
            let scope = u32_ne(&v[24..28])?;
            let ip = Ipv6Addr::from(octets);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                ip,
                port(v),
                flowinfo,
                scope,
            )))
        }
        _ => Err(Malformed("endpoint of an unknown family or too short")),
    }
}

fn key_value(v: &[u8]) -> std::result::Result<WgKey, Malformed> {
    v.try_into()
        .map_err(|_| Malformed("WireGuard key of another length than 32"))
}

fn u64_ne(v: &[u8]) -> std::result::Result<u64, Malformed> {
    Ok(u64::from_ne_bytes(v.try_into().map_err(|_| {
        Malformed("u64 attribute of another length")
    })?))
}

/// Decodes a datagram of GET_DEVICE dump messages as [`Wireguard::device`] does (every
/// message of a family's type), so that the decoder can be driven with
/// arbitrary bytes from outside the crate (the fuzz targets in `tests/fuzz`); the
/// client itself never calls this.
#[doc(hidden)]
pub fn decode_dump(datagram: &[u8]) -> std::result::Result<WgDevice, Malformed> {
    let mut device = WgDevice::default();
    for msg in cni_netlink::messages(datagram) {
        let msg = msg?;
        // Below 0x10 (`NLMSG_MIN_TYPE`): netlink's own messages, never a family's.
        if msg.ty >= 0x10 {
            add_dump_message(&mut device, msg.payload)?;
        }
    }
    Ok(device)
}

/// How one dump of a device ended.
enum Dump {
    /// The device as it was throughout the dump.
    Device(WgDevice),
    /// The device changed while the dump ran.
    Changed,
    /// The reader gave up before the end.
    GaveUp,
}

/// The peers changed during each of [`DUMP_ATTEMPTS`] dumps of `ifname`.
fn changed_during_each_dump(ifname: &str) -> Error {
    let busy = io::Error::new(
        io::ErrorKind::Interrupted,
        format!("the peers changed during each of {DUMP_ATTEMPTS} dumps"),
    );
    Error::netlink(
        format!("failed to read WireGuard device {ifname:?}"),
        busy.into(),
    )
}

/// Adds one message of a GET_DEVICE dump (payload after the netlink header) to
/// `device`: the settings the first message carries, and the peers, a peer that
/// repeats the last one's key continuing its allowed IPs.
fn add_dump_message(device: &mut WgDevice, payload: &[u8]) -> std::result::Result<(), Malformed> {
    let (_, attributes) = genl::split(payload)?;
    for attr in attrs(attributes) {
        let (ty, v) = attr?;
        match ty {
            WGDEVICE_A_IFINDEX => device.ifindex = u32_ne(v)?,
            WGDEVICE_A_PRIVATE_KEY => {
                key_value(v)?;
                device.has_private_key = true;
            }
            WGDEVICE_A_PUBLIC_KEY => device.public_key = Some(key_value(v)?),
            WGDEVICE_A_LISTEN_PORT => device.listen_port = u16_ne(v)?,
            WGDEVICE_A_FWMARK => device.fwmark = u32_ne(v)?,
            WGDEVICE_A_PEERS => {
                for peer in attrs(v) {
                    let (_, peer) = peer?;
                    let peer = parse_peer(peer)?;
                    match device.peers.last_mut() {
                        Some(last) if last.public_key == peer.public_key => {
                            last.allowed_ips.extend(peer.allowed_ips);
                        }
                        _ => device.peers.push(peer),
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn parse_peer(data: &[u8]) -> std::result::Result<WgPeer, Malformed> {
    let mut key = None;
    let mut peer = WgPeer {
        public_key: [0; 32],
        endpoint: None,
        allowed_ips: Vec::new(),
        last_handshake: None,
        rx_bytes: 0,
        tx_bytes: 0,
    };
    for attr in attrs(data) {
        let (ty, v) = attr?;
        match ty {
            WGPEER_A_PUBLIC_KEY => key = Some(key_value(v)?),
            WGPEER_A_ENDPOINT => peer.endpoint = Some(parse_sockaddr(v)?),
            WGPEER_A_LAST_HANDSHAKE_TIME => peer.last_handshake = parse_timespec(v)?,
            WGPEER_A_RX_BYTES => peer.rx_bytes = u64_ne(v)?,
            WGPEER_A_TX_BYTES => peer.tx_bytes = u64_ne(v)?,
            WGPEER_A_ALLOWEDIPS => {
                for ip in attrs(v) {
                    let (_, ip) = ip?;
                    peer.allowed_ips.push(parse_allowed_ip(ip)?);
                }
            }
            _ => {}
        }
    }
    peer.public_key = key.ok_or(Malformed("WireGuard peer without a public key"))?;
    Ok(peer)
}

/// `struct __kernel_timespec` (two signed 64-bit numbers); all zeros for never.
fn parse_timespec(v: &[u8]) -> std::result::Result<Option<SystemTime>, Malformed> {
    if v.len() != 16 {
        return Err(Malformed("timespec of another length than 16"));
    }
    let half = |at: usize| {
        let bytes: [u8; 8] = v[at..at + 8].try_into().unwrap_or_default();
        i64::from_ne_bytes(bytes)
    };
    let (secs, nanos) = (half(0), half(8));
    if secs == 0 && nanos == 0 {
        return Ok(None);
    }
    let secs = u64::try_from(secs).map_err(|_| Malformed("handshake time before 1970"))?;
    let nanos = u32::try_from(nanos)
        .ok()
        .filter(|n| *n < 1_000_000_000)
        .ok_or(Malformed("timespec nanoseconds out of range"))?;
    SystemTime::UNIX_EPOCH
        .checked_add(Duration::new(secs, nanos))
        .map(Some)
        .ok_or(Malformed("handshake time out of range"))
}

fn parse_allowed_ip(data: &[u8]) -> std::result::Result<IpNetwork, Malformed> {
    let (mut family, mut address, mut prefix) = (None, None, None);
    for attr in attrs(data) {
        let (ty, v) = attr?;
        match ty {
            WGALLOWEDIP_A_FAMILY => family = Some(u16_ne(v)?),
            WGALLOWEDIP_A_IPADDR => address = Some(v),
            WGALLOWEDIP_A_CIDR_MASK => prefix = Some(u8_value(v)?),
            _ => {}
        }
    }
    let ip = match (family, address) {
        (Some(AF_INET), Some(v)) => {
            let octets: [u8; 4] = v.try_into().map_err(|_| Malformed("allowed IPv4 length"))?;
            IpAddr::from(octets)
        }
        (Some(AF_INET6), Some(v)) => {
            let octets: [u8; 16] = v.try_into().map_err(|_| Malformed("allowed IPv6 length"))?;
            IpAddr::from(octets)
        }
        _ => return Err(Malformed("allowed IP without a known family or an address")),
    };
    let prefix = prefix.ok_or(Malformed("allowed IP without a prefix length"))?;
    IpNetwork::new(ip, prefix).map_err(|_| Malformed("allowed IP prefix length out of range"))
}

#[cfg(test)]
mod tests {
    use cni_netlink::messages;

    use super::*;
    use crate::netlink::tests::{hex, message};

    /// A family number as the kernel might hand it out.
    const FAMILY: u16 = 0x1c;

    fn key(n: u8) -> WgKey {
        [n; 32]
    }

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    /// The peers' nests of the SET_DEVICE requests, decoded as a dump would be, and
    /// each peer's flags as sent.
    fn sent(requests: &[Vec<u8>]) -> (WgDevice, Vec<(WgKey, u32)>) {
        let mut device = WgDevice::default();
        let mut flags = Vec::new();
        for request in requests {
            let mut msgs = messages(request);
            let msg = msgs.next().unwrap().unwrap();
            assert!(msgs.next().is_none());
            assert_eq!(msg.ty, FAMILY);
            assert_eq!(msg.flags, NLM_F_REQUEST | NLM_F_ACK);
            assert_eq!(msg.payload[..4], [WG_CMD_SET_DEVICE, 1, 0, 0]);
            add_dump_message(&mut device, msg.payload).unwrap();
            let (_, attributes) = genl::split(msg.payload).unwrap();
            for (ty, v) in attrs(attributes).map(std::result::Result::unwrap) {
                if ty != WGDEVICE_A_PEERS {
                    continue;
                }
                for (_, peer) in attrs(v).map(std::result::Result::unwrap) {
                    let mut key = None;
                    let mut peer_flags = None;
                    for (ty, v) in attrs(peer).map(std::result::Result::unwrap) {
                        match ty {
                            WGPEER_A_PUBLIC_KEY => key = Some(key_value(v).unwrap()),
                            WGPEER_A_FLAGS => peer_flags = Some(u32_ne(v).unwrap()),
                            _ => {}
                        }
                    }
                    flags.push((key.unwrap(), peer_flags.unwrap()));
                }
            }
        }
        (device, flags)
    }

    #[test]
    fn set_peer_lays_out_what_wg_set_sends() {
        // `wg set wg0 peer <key 0x11...> endpoint 192.0.2.1:51820 persistent-keepalive
        // 25 allowed-ips 10.244.1.0/24,fd00:244:1::/64`, attribute for attribute, with
        // the allowed IPs replaced.
        let peer = WgPeerConfig {
            public_key: key(0x11),
            endpoint: Some("192.0.2.1:51820".parse().unwrap()),
            allowed_ips: vec![net("10.244.1.7/24"), net("fd00:244:1::/64")],
            persistent_keepalive: Some(25),
        };
        let got = set_messages(
            FAMILY,
            "wg0",
            None,
            &[PeerChange::Set(&peer)],
            MESSAGE_BUDGET,
        );
        let keys = "11111111".repeat(8);
        let want = hex(&format!(
            "b4000000 1c00 0500 00000000 00000000 \
             01010000 \
             08000200 77673000 \
             98000880 94000080 \
             24000100 {keys} \
             08000300 02000000 \
             14000400 0200 ca6c c0000201 00000000 00000000 \
             06000500 19000000 \
             48000980 \
             1c000080 06000100 02000000 08000200 0af40100 05000300 18000000 \
             28000080 06000100 0a000000 14000200 fd000244 00010000 00000000 00000000 \
             05000300 40000000"
        ));
        assert_eq!(got, [want]);
    }

    #[test]
    fn set_device_and_remove_peer_carry_only_what_they_change() {
        let settings = DeviceSettings {
            private_key: &key(0x22),
            listen_port: 51820,
            fwmark: 0x4000,
        };
        let got = set_messages(FAMILY, "wg0", Some(&settings), &[], MESSAGE_BUDGET);
        let keys = "22222222".repeat(8);
        let want = hex(&format!(
            "50000000 1c00 0500 00000000 00000000 \
             01010000 \
             08000200 77673000 \
             24000300 {keys} \
             06000600 6cca0000 \
             08000700 00400000"
        ));
        assert_eq!(got, [want]);

        let got = set_messages(FAMILY, "wg0", None, &[PeerChange::Remove(&key(0x33))], 4096);
        let keys = "33333333".repeat(8);
        let want = hex(&format!(
            "50000000 1c00 0500 00000000 00000000 \
             01010000 \
             08000200 77673000 \
             34000880 30000080 \
             24000100 {keys} \
             08000300 01000000"
        ));
        assert_eq!(got, [want]);
    }

    #[test]
    fn the_link_is_what_ip_link_add_type_wireguard_sends() {
        let got = message(RTM_NEWLINK, 0x605, |w| {
            wireguard_link_message(w, "wg0", Some(1420));
        });
        let want = hex("44000000 1000 0506 01000000 00000000 \
             00000000 00000000 00000000 00000000 \
             08000400 8c050000 \
             08000300 77673000 \
             14001200 0d000100 77697265 67756172 64000000");
        assert_eq!(got, want);
    }

    #[test]
    fn an_endpoint_round_trips_in_both_families() {
        for text in ["192.0.2.1:51820", "[2001:db8::1]:443", "[fe80::1%7]:51820"] {
            let endpoint: SocketAddr = text.parse().unwrap();
            let bytes = sockaddr(endpoint);
            assert_eq!(bytes.len(), sockaddr_len(endpoint));
            assert_eq!(parse_sockaddr(&bytes), Ok(endpoint), "{text}");
        }
        assert!(parse_sockaddr(&[2, 0, 1]).is_err());
        assert!(parse_sockaddr(&[10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(parse_sockaddr(&[1; 16]).is_err());
    }

    /// Many peers with one prefix of each family, as a node sees a cluster.
    fn cluster(peers: u16) -> Vec<WgPeerConfig> {
        (0..peers)
            .map(|n| {
                let mut public_key = [0; 32];
                public_key[..2].copy_from_slice(&n.to_be_bytes());
                let [hi, lo] = n.to_be_bytes();
                WgPeerConfig {
                    public_key,
                    endpoint: Some(SocketAddr::from(([192, 168, hi, lo], 51820))),
                    allowed_ips: vec![
                        net(&format!("10.{hi}.{lo}.0/24")),
                        net(&format!("fd00:{n:x}::/64")),
                    ],
                    persistent_keepalive: None,
                }
            })
            .collect()
    }

    #[test]
    fn many_peers_are_cut_between_requests_never_inside_a_peer() {
        let peers = cluster(3000);
        let changes: Vec<_> = peers.iter().map(PeerChange::Set).collect();
        let settings = DeviceSettings {
            private_key: &key(1),
            listen_port: 1,
            fwmark: 0,
        };
        let requests = set_messages(FAMILY, "wg-pods", Some(&settings), &changes, MESSAGE_BUDGET);
        assert!(requests.len() >= 3, "{} requests", requests.len());
        for request in &requests {
            assert!(request.len() <= MESSAGE_BUDGET, "{}", request.len());
        }
        let (device, flags) = sent(&requests);
        assert!(device.has_private_key);
        assert_eq!(flags.len(), peers.len(), "no peer was cut in two");
        assert!(flags.iter().all(|(_, f)| *f == WGPEER_F_REPLACE_ALLOWEDIPS));
        let back: Vec<_> = device
            .peers
            .iter()
            .map(|p| (p.public_key, p.endpoint, p.allowed_ips.clone()))
            .collect();
        let want: Vec<_> = peers
            .iter()
            .map(|p| (p.public_key, p.endpoint, p.allowed_ips.clone()))
            .collect();
        assert_eq!(back, want);
        // Only the first request carries the device's settings.
        for request in &requests[1..] {
            let msg = messages(request).next().unwrap().unwrap();
            let (_, attributes) = genl::split(msg.payload).unwrap();
            assert!(
                attrs(attributes)
                    .map(std::result::Result::unwrap)
                    .all(|(ty, _)| ty != WGDEVICE_A_PRIVATE_KEY)
            );
        }
    }

    #[test]
    fn a_peer_that_fits_no_request_is_cut_its_first_part_replacing() {
        let big = WgPeerConfig {
            public_key: key(9),
            endpoint: None,
            allowed_ips: (0..5000u32)
                .map(|n| {
                    IpNetwork::new(IpAddr::from((0x0a00_0000 + (n << 8)).to_be_bytes()), 24)
                        .unwrap()
                })
                .collect(),
            persistent_keepalive: Some(5),
        };
        let small = cluster(2);
        let changes = [
            PeerChange::Set(&small[0]),
            PeerChange::Set(&big),
            PeerChange::Set(&small[1]),
        ];
        let requests = set_messages(FAMILY, "wg0", None, &changes, MESSAGE_BUDGET);
        for request in &requests {
            assert!(request.len() <= MESSAGE_BUDGET, "{}", request.len());
        }
        let (device, flags) = sent(&requests);
        let parts: Vec<u32> = flags
            .iter()
            .filter(|(k, _)| *k == key(9))
            .map(|(_, f)| *f)
            .collect();
        assert!(parts.len() >= 3, "{parts:?}");
        assert_eq!(parts[0], WGPEER_F_REPLACE_ALLOWEDIPS);
        assert!(parts[1..].iter().all(|f| *f == WGPEER_F_UPDATE_ONLY));
        // Joined back like a dump: three peers, the big one whole and in order.
        assert_eq!(device.peers.len(), 3);
        assert_eq!(device.peers[1].allowed_ips, big.allowed_ips);
        assert_eq!(device.peers[2].allowed_ips, small[1].allowed_ips);

        // A tiny budget still makes progress, one prefix a request.
        let tiny = set_messages(FAMILY, "wg0", None, &[PeerChange::Set(&small[0])], 64);
        assert_eq!(tiny.len(), 2);
        assert_eq!(sent(&tiny).0.peers[0].allowed_ips, small[0].allowed_ips);
    }

    #[test]
    fn planned_sizes_are_the_written_sizes() {
        // With the budget exactly a request's size nothing is cut; one byte less and
        // the request is cut (where there are allowed IPs to cut).
        let v6_without_ips = WgPeerConfig {
            public_key: key(4),
            endpoint: Some("[2001:db8::4]:51820".parse().unwrap()),
            allowed_ips: vec![],
            persistent_keepalive: Some(1),
        };
        let peers = [cluster(3), vec![v6_without_ips]].concat();
        let one =
            |peer, budget| set_messages(FAMILY, "wg0", None, &[PeerChange::Set(peer)], budget);
        for peer in &peers {
            let exact = one(peer, MESSAGE_BUDGET)[0].len();
            assert_eq!(one(peer, exact).len(), 1);
            assert_eq!(one(peer, exact - 1).len() > 1, !peer.allowed_ips.is_empty());
        }
        let two = [PeerChange::Set(&peers[0]), PeerChange::Set(&peers[3])];
        let exact = set_messages(FAMILY, "wg0", None, &two, MESSAGE_BUDGET)[0].len();
        assert_eq!(set_messages(FAMILY, "wg0", None, &two, exact).len(), 1);
        let cut = set_messages(FAMILY, "wg0", None, &two, exact - 1);
        assert_eq!(cut.len(), 2);
        let (_, flags) = sent(&cut);
        assert_eq!(flags.len(), 2, "each peer whole in its own request");
    }

    /// A dump as the kernel cuts it: the device and two peers, the second one's
    /// allowed IPs continued in a second message, then a third peer.
    fn kernel_dump() -> Vec<u8> {
        let mut w = Writer::new();
        let peer = |w: &mut Writer, key: WgKey, first: bool, ips: &[&str]| {
            let nest = w.nest_start(NLA_F_NESTED);
            w.attr(WGPEER_A_PUBLIC_KEY, &key);
            if first {
                w.attr(2, &[0; 32]); // preshared key
                let mut time = 1_700_000_000i64.to_ne_bytes().to_vec();
                time.extend_from_slice(&5i64.to_ne_bytes());
                w.attr(WGPEER_A_LAST_HANDSHAKE_TIME, &time);
                w.attr_u16(WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL, 0);
                w.attr(0, &[]); // the kernel's padding before 64-bit values
                w.attr(WGPEER_A_TX_BYTES, &1234u64.to_ne_bytes());
                w.attr(WGPEER_A_RX_BYTES, &u64::MAX.to_ne_bytes());
                w.attr_u32(10, 1); // protocol version
                w.attr(
                    WGPEER_A_ENDPOINT,
                    &sockaddr("[2001:db8::2]:51820".parse().unwrap()),
                );
            }
            let list = w.nest_start(WGPEER_A_ALLOWEDIPS | NLA_F_NESTED);
            for ip in ips {
                write_allowed_ip(w, &net(ip));
            }
            w.nest_end(list);
            w.nest_end(nest);
        };
        let start = w.begin_msg(FAMILY, 0x2, 1);
        genl::header(&mut w, WG_CMD_GET_DEVICE, 1);
        w.attr_u16(WGDEVICE_A_LISTEN_PORT, 51820);
        w.attr_u32(WGDEVICE_A_FWMARK, 0);
        w.attr_u32(WGDEVICE_A_IFINDEX, 4);
        w.attr_str(WGDEVICE_A_IFNAME, "wg0");
        w.attr(WGDEVICE_A_PRIVATE_KEY, &key(0x77));
        w.attr(WGDEVICE_A_PUBLIC_KEY, &key(0x78));
        let peers = w.nest_start(WGDEVICE_A_PEERS | NLA_F_NESTED);
        peer(&mut w, key(1), true, &["10.244.1.0/24"]);
        peer(&mut w, key(2), true, &["10.244.2.0/24", "10.244.3.0/24"]);
        w.nest_end(peers);
        w.end_msg(start);
        let start = w.begin_msg(FAMILY, 0x2, 1);
        genl::header(&mut w, WG_CMD_GET_DEVICE, 1);
        let peers = w.nest_start(WGDEVICE_A_PEERS | NLA_F_NESTED);
        peer(&mut w, key(2), false, &["fd00:244:2::/64"]);
        peer(&mut w, key(3), true, &[]);
        w.nest_end(peers);
        w.end_msg(start);
        w.into_bytes()
    }

    fn decode(dump: &[u8]) -> std::result::Result<WgDevice, Malformed> {
        decode_dump(dump)
    }

    #[test]
    fn a_dump_cut_inside_a_peer_is_joined_back() {
        let device = decode(&kernel_dump()).unwrap();
        let handshake = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5);
        let endpoint = Some("[2001:db8::2]:51820".parse().unwrap());
        let peer = |n: u8, ips: &[&str]| WgPeer {
            public_key: key(n),
            endpoint,
            allowed_ips: ips.iter().map(|s| net(s)).collect(),
            last_handshake: Some(handshake),
            rx_bytes: u64::MAX,
            tx_bytes: 1234,
        };
        assert_eq!(
            device,
            WgDevice {
                ifindex: 4,
                public_key: Some(key(0x78)),
                has_private_key: true,
                listen_port: 51820,
                fwmark: 0,
                peers: vec![
                    peer(1, &["10.244.1.0/24"]),
                    peer(2, &["10.244.2.0/24", "10.244.3.0/24", "fd00:244:2::/64"]),
                    peer(3, &[]),
                ],
            }
        );
    }

    #[test]
    fn never_handshaken_is_none_and_bad_times_are_errors() {
        assert_eq!(parse_timespec(&[0; 16]), Ok(None));
        assert!(parse_timespec(&[0; 12]).is_err());
        let mut before_1970 = (-1i64).to_ne_bytes().to_vec();
        before_1970.extend_from_slice(&0i64.to_ne_bytes());
        assert!(parse_timespec(&before_1970).is_err());
        let mut too_many_nanos = 1i64.to_ne_bytes().to_vec();
        too_many_nanos.extend_from_slice(&1_000_000_000i64.to_ne_bytes());
        assert!(parse_timespec(&too_many_nanos).is_err());
    }

    #[test]
    fn bad_keys_and_prefixes_are_errors() {
        let mut w = Writer::new();
        let start = w.begin_msg(FAMILY, 0, 1);
        genl::header(&mut w, 0, 1);
        w.attr(WGDEVICE_A_PUBLIC_KEY, &[1; 31]);
        w.end_msg(start);
        assert!(decode(w.as_bytes()).is_err());
        let mut ip = Writer::new();
        ip.attr_u16(WGALLOWEDIP_A_FAMILY, AF_INET);
        ip.attr(WGALLOWEDIP_A_IPADDR, &[10, 0, 0, 0]);
        ip.attr_u8(WGALLOWEDIP_A_CIDR_MASK, 33);
        assert!(parse_allowed_ip(ip.as_bytes()).is_err());
        let mut v6_length = Writer::new();
        v6_length.attr_u16(WGALLOWEDIP_A_FAMILY, AF_INET6);
        v6_length.attr(WGALLOWEDIP_A_IPADDR, &[10, 0, 0, 0]);
        v6_length.attr_u8(WGALLOWEDIP_A_CIDR_MASK, 8);
        assert!(parse_allowed_ip(v6_length.as_bytes()).is_err());
        assert!(parse_peer(&[]).is_err(), "a peer needs its key");
    }

    #[test]
    fn truncated_or_corrupted_dumps_are_errors_never_panics() {
        let dump = kernel_dump();
        for cut in 0..dump.len() {
            let _ = decode(&dump[..cut]);
        }
        for at in 0..dump.len() {
            for value in [0x00, 0x03, 0x81, 0xff] {
                let mut bytes = dump.clone();
                bytes[at] = value;
                let _ = decode(&bytes);
            }
        }
    }

    #[test]
    fn keys_are_named_by_their_first_bytes() {
        assert_eq!(key_text(&key(0xab)), "abababababab…");
    }
}

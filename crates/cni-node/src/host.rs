//! What the agent reads of this host: over netlink its addresses and main-table
//! routes (split into the agent's own and everyone else's; [`HostView`] is what the plan
//! routes on) and the links' MTUs; whether portmap is installed; the bridge plugin's pod
//! records; the pod MTU chosen from them ([`choose_mtu`]); and the kernel's
//! notifications of link, address and route changes, which wake the reconciler.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cni_linux::MacAddr;
use cni_linux::netlink::{
    Family, FdbEntry, Link, Neighbour, Netlink, Notified, Route, is_route_added_with_protocol,
    neighbour_change, removed_address, subscribe_host_changes,
};
use ipnetwork::IpNetwork;

use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::wake::Wake;

/// The main routing table's id.
pub const MAIN_TABLE: u32 = 254;

/// A route on this host that is not ours: what decides whether a node is on-link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoute {
    /// Destination.
    pub dst: IpNetwork,
    /// Next hop, for a route through a gateway.
    pub gw: Option<IpAddr>,
}

/// What the plan needs to know of this host.
#[derive(Debug, Clone, Default)]
pub struct HostView {
    /// Every address on this host's links.
    pub addresses: Vec<IpAddr>,
    /// The main table's unicast routes, except the agent's own.
    pub routes: Vec<HostRoute>,
    /// This node's WireGuard device, when it is ready to encrypt (filled in by the
    /// reconciler's encryption step, not read with the rest).
    pub wireguard: Option<crate::encryption::LocalEncryption>,
}

impl HostView {
    /// How this host reaches `ip`: the longest-prefix match of the main table.
    pub(crate) fn reach(&self, ip: IpAddr) -> Reach {
        let best = self
            .routes
            .iter()
            .filter(|r| r.dst.is_ipv4() == ip.is_ipv4() && r.dst.contains(ip))
            .max_by_key(|r| r.dst.prefix());
        match best {
            None => Reach::NoRoute,
            Some(HostRoute { gw: Some(gw), .. }) => Reach::Gateway(*gw),
            Some(HostRoute { gw: None, .. }) => Reach::OnLink,
        }
    }
}

/// How this host reaches an address.
pub(crate) enum Reach {
    /// On one of its links.
    OnLink,
    /// Through this gateway.
    Gateway(IpAddr),
    /// Not at all.
    NoRoute,
}

/// One reading of the host.
#[derive(Debug, Clone, Default)]
pub struct HostState {
    /// Addresses and foreign routes, for the plan.
    pub view: HostView,
    /// The agent's own routes in the main table (marked with its protocol number).
    pub ours: Vec<Route>,
    /// Every other main-table unicast route, by destination.
    pub foreign: BTreeMap<IpNetwork, Vec<Route>>,
    /// Addresses with the MTU of the link that holds them.
    pub address_mtus: Vec<(IpAddr, u32, String)>,
    /// The MTU and name of the link of the IPv4 default route, if any.
    pub default_route_link: Option<(u32, String)>,
    /// Whether a `portmap` plugin is in the CNI bin dir.
    pub portmap_installed: bool,
    /// Whether a `bandwidth` plugin is in the CNI bin dir.
    pub bandwidth_installed: bool,
    /// The index of the link holding each address.
    pub address_indexes: BTreeMap<IpAddr, u32>,
    /// The links named like the agent's VXLAN devices and its WireGuard device,
    /// whatever they are, with what they hold.
    pub overlay: Vec<DeviceState>,
    /// The bridge plugin's pod records, address -> pod (`namespace/name`), when the
    /// agent reads them (NetworkPolicy enforced): a new pod's address is known here
    /// before the API shows it.
    pub pod_records: BTreeMap<IpAddr, String>,
}

/// A link with the name of one of the agent's VXLAN devices, as read.
#[derive(Debug, Clone)]
pub struct DeviceState {
    /// The link.
    pub link: Link,
    /// Its addresses.
    pub addresses: Vec<IpAddr>,
    /// Its entries, when they were read (a VXLAN device's, on a read that asks for them).
    pub entries: Option<DeviceEntries>,
}

/// What a VXLAN device holds of the kind the agent writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceEntries {
    /// Its own (`self`) FDB entries: MAC -> destination.
    pub fdb: BTreeMap<[u8; 6], IpAddr>,
    /// Its permanent neighbour entries: address -> MAC.
    pub neighbours: BTreeMap<IpAddr, MacAddr>,
}

impl DeviceEntries {
    /// The entries the agent writes, of what the kernel lists.
    pub fn of(fdb: &[FdbEntry], neighbours: &[Neighbour]) -> Self {
        Self {
            fdb: fdb
                .iter()
                .filter(|e| e.is_self())
                .filter_map(|e| Some((e.mac.0, e.dst?)))
                .collect(),
            neighbours: neighbours
                .iter()
                .filter(|n| n.is_permanent())
                .filter_map(|n| Some((n.ip, n.mac?)))
                .collect(),
        }
    }
}

/// Reads the host: a trait so the reconciler is tested without a kernel.
pub trait HostReader: Send {
    /// One reading; the VXLAN devices' entries only with `entries` (thousands of them
    /// at scale: the reconciler keeps what it wrote and reads them back on a resync).
    fn read(&self, entries: bool) -> Result<HostState>;
}

/// The real host: netlink in the agent's netns and the CNI bin dir.
#[derive(Debug)]
pub struct Host {
    /// The netlink connection.
    pub nl: Netlink,
    /// The agent's route protocol number.
    pub protocol: u8,
    /// The CNI bin dir.
    pub bin_dir: PathBuf,
    /// The names of the agent's VXLAN devices and of its WireGuard device.
    pub overlay_names: Vec<String>,
    /// Where the bridge plugin leaves its pod records, when they are read.
    pub records_dir: Option<PathBuf>,
}

impl HostReader for Host {
    fn read(&self, entries: bool) -> Result<HostState> {
        let mut state =
            read(&self.nl, self.protocol, &self.overlay_names, entries).map_err(Error::ReadHost)?;
        state.portmap_installed = self.bin_dir.join("portmap").is_file();
        state.bandwidth_installed = self.bin_dir.join("bandwidth").is_file();
        if let Some(dir) = &self.records_dir {
            state.pod_records = pod_records(dir);
        }
        Ok(state)
    }
}

/// The pod records in `dir`: address -> pod (`namespace/name`); a record that cannot be
/// read is left out, as if the pod had none yet.
pub fn pod_records(dir: &Path) -> BTreeMap<IpAddr, String> {
    cni_protocol::pod_record::read_all(dir)
        .into_iter()
        .map(|(ip, record)| (ip, record.pod))
        .collect()
}

/// What the host-events thread tells the reconciler about its VXLAN devices' entries,
/// which the reconciler keeps in memory between resyncs: which devices are its own (it
/// says so after every read of the host), and whether an entry of one of them was
/// deleted since it last read them (by hand, or by the reconciler itself, which costs
/// one read more).
#[derive(Debug, Default)]
pub struct EntriesWatch {
    devices: Mutex<BTreeSet<u32>>,
    lost: AtomicBool,
}

impl EntriesWatch {
    /// The reconciler's devices are now `devices`.
    pub fn watch(&self, devices: impl IntoIterator<Item = u32>) {
        *self.devices.lock().unwrap_or_else(PoisonError::into_inner) =
            devices.into_iter().collect();
    }

    /// Whether an entry of the devices was deleted since the last call.
    pub fn take_lost(&self) -> bool {
        self.lost.swap(false, Ordering::SeqCst)
    }

    /// For a neighbour notification, whether it is a change the reconciler must act
    /// on (an entry of one of its devices deleted); `None` for any other notification.
    fn heard(&self, msg: &cni_linux::netlink::Message<'_>) -> Option<bool> {
        let (index, deleted) = neighbour_change(msg)?;
        let ours = deleted
            && self
                .devices
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(&index);
        if ours {
            self.lost.store(true, Ordering::SeqCst);
        }
        Some(ours)
    }
}

/// Wakes the reconciler on every link, address and route change of this host, and on
/// the deletion of an entry of its VXLAN devices ([`EntriesWatch`]), from
/// a thread of its own blocked on the kernel's notifications. The routes the agent
/// adds itself (marked with `protocol`) come back as notifications too and are not a
/// change; a route of ours that is deleted (by hand, say) is. `address_removed` hears
/// of every address this host loses, before the wake-up.
pub fn notify_changes(
    wake: Arc<Wake>,
    metrics: Arc<Metrics>,
    protocol: u8,
    entries: Arc<EntriesWatch>,
    address_removed: impl Fn(IpAddr) + Send + 'static,
) -> Result<()> {
    let mut subscription = subscribe_host_changes().map_err(Error::HostEvents)?;
    std::thread::Builder::new()
        .name("host-events".into())
        .spawn(move || {
            loop {
                let mut removed = Vec::new();
                let heard = subscription.wait(|m| {
                    removed.extend(removed_address(m));
                    // Neighbour entries change all the time on a busy node: only the
                    // loss of one of ours is a change.
                    entries
                        .heard(m)
                        .unwrap_or_else(|| !is_route_added_with_protocol(m, protocol))
                });
                removed.into_iter().for_each(&address_removed);
                match heard {
                    Ok(Notified::Messages { total, kept }) => {
                        metrics.host_events(total);
                        if kept == 0 {
                            continue;
                        }
                    }
                    Ok(Notified::Overflow) => {
                        tracing::debug!("host notifications overflowed: reading the host anew");
                    }
                    Err(e) => {
                        tracing::warn!(
                            "cannot read host notifications ({e}); the resync still repairs"
                        );
                        std::thread::sleep(Duration::from_secs(1));
                        continue;
                    }
                }
                wake.notify();
            }
        })
        .map_err(|source| Error::Thread {
            name: "host-events",
            source,
        })?;
    Ok(())
}

/// Wakes the reconciler whenever a pod record appears in or leaves `dir` (the bridge
/// plugin writes one at ADD, removes it at DEL), from a thread of its own blocked on
/// inotify. The directory is created if missing, so it can be watched before the first
/// pod.
pub fn notify_records(dir: &Path, wake: Arc<Wake>) -> Result<()> {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let fail = |source: std::io::Error| Error::Records {
        path: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC).map_err(|e| fail(e.into()))?;
    inotify
        .add_watch(
            dir,
            AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_MOVED_FROM,
        )
        .map_err(|e| fail(e.into()))?;
    std::thread::Builder::new()
        .name("pod-records".into())
        .spawn(move || {
            loop {
                match inotify.read_events() {
                    Ok(events) if events.is_empty() => {}
                    Ok(_) => wake.notify(),
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => {
                        tracing::warn!(
                            "cannot read pod record notifications ({e}); the resync still \
                             reads the records"
                        );
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            }
        })
        .map_err(|source| Error::Thread {
            name: "pod-records",
            source,
        })?;
    Ok(())
}

/// Wakes the reconciler whenever the WireGuard key file in `dir` is replaced
/// (`cni-node rotate-key`), from a thread of its own blocked on inotify. The directory
/// is made root-only if missing, so it can be watched before the first key.
pub fn notify_key_dir(dir: &Path, wake: Arc<Wake>) -> Result<()> {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    use std::os::unix::fs::DirBuilderExt;
    let fail = |source: std::io::Error| Error::KeyFile {
        action: "watch",
        path: crate::encryption::key::path(dir),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(fail)?;
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC).map_err(|e| fail(e.into()))?;
    inotify
        .add_watch(
            dir,
            AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_DELETE,
        )
        .map_err(|e| fail(e.into()))?;
    std::thread::Builder::new()
        .name("key-file".into())
        .spawn(move || {
            loop {
                match inotify.read_events() {
                    Ok(events) if events.is_empty() => {}
                    Ok(_) => wake.notify(),
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => {
                        tracing::warn!(
                            "cannot read the key file's notifications ({e}); the resync still \
                             reads the key"
                        );
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            }
        })
        .map_err(|source| Error::Thread {
            name: "key-file",
            source,
        })?;
    Ok(())
}

/// Reads addresses, routes and links, and the links named `overlay_names` (with their
/// entries when `entries`).
pub fn read(
    nl: &Netlink,
    protocol: u8,
    overlay_names: &[String],
    entries: bool,
) -> cni_linux::Result<HostState> {
    let links = nl.links()?;
    let mtu_of = |index: u32| {
        links
            .iter()
            .find(|l| l.index == index)
            .map(|l| (l.mtu, l.name.clone()))
    };
    let mut state = HostState::default();
    let addresses = nl.all_addresses(None)?;
    for address in &addresses {
        state.view.addresses.push(address.ip.ip());
        state
            .address_indexes
            .entry(address.ip.ip())
            .or_insert(address.index);
        if let Some((mtu, name)) = mtu_of(address.index) {
            state.address_mtus.push((address.ip.ip(), mtu, name));
        }
    }
    for family in Family::ALL {
        for route in nl.routes(family, Some(MAIN_TABLE))? {
            if route.protocol == Some(protocol) {
                state.ours.push(route);
                continue;
            }
            if route.dst.prefix() == 0 && family == Family::V4 && state.default_route_link.is_none()
            {
                state.default_route_link = route.oif.and_then(mtu_of);
            }
            state.view.routes.push(HostRoute {
                dst: route.dst,
                gw: route.gw,
            });
            state.foreign.entry(route.dst).or_default().push(route);
        }
    }
    for link in links.iter().filter(|l| overlay_names.contains(&l.name)) {
        let entries = if entries && link.vxlan.is_some() {
            Some(DeviceEntries::of(
                &nl.fdb_entries(link.index)?,
                &nl.neighbours(link.index, None)?,
            ))
        } else {
            None
        };
        state.overlay.push(DeviceState {
            link: link.clone(),
            addresses: addresses
                .iter()
                .filter(|a| a.index == link.index)
                .map(|a| a.ip.ip())
                .collect(),
            entries,
        });
    }
    Ok(state)
}

/// The pod MTU and why: the MTU of the link holding this node's InternalIP (the
/// smaller one when the families differ), else the default route's link, else 1500.
pub fn choose_mtu(state: &HostState, internal_ips: &[IpAddr]) -> (u32, String) {
    let mut best: Option<(u32, String)> = None;
    for ip in internal_ips {
        if let Some((_, mtu, link)) = state.address_mtus.iter().find(|(a, _, _)| a == ip) {
            let why = format!("the MTU of {link}, which holds the InternalIP {ip}");
            if best.as_ref().is_none_or(|(m, _)| mtu < m) {
                best = Some((*mtu, why));
            }
        }
    }
    if let Some(best) = best {
        return best;
    }
    if let Some((mtu, link)) = &state.default_route_link {
        let why = if internal_ips.is_empty() {
            format!("the MTU of {link}, the default route's link (the node has no InternalIP yet)")
        } else {
            format!("the MTU of {link}, the default route's link (no link holds the InternalIP)")
        };
        return (*mtu, why);
    }
    (
        1500,
        "1500, the Ethernet default: no link holds the InternalIP and there is no default route"
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn neighbour_message(
        ty: u16,
        index: i32,
        payload: &mut Vec<u8>,
    ) -> cni_linux::netlink::Message<'_> {
        payload.clear();
        payload.extend_from_slice(&[7, 0, 0, 0]);
        payload.extend_from_slice(&index.to_ne_bytes());
        payload.extend_from_slice(&[0x80, 0, 0, 0]);
        cni_linux::netlink::Message {
            ty,
            flags: 0,
            seq: 0,
            payload,
        }
    }

    #[test]
    fn only_a_deleted_entry_of_our_devices_is_heard() {
        const NEW: u16 = 28;
        const DEL: u16 = 29;
        let watch = EntriesWatch::default();
        watch.watch([40]);
        let mut buf = Vec::new();
        assert_eq!(
            watch.heard(&neighbour_message(NEW, 40, &mut buf)),
            Some(false)
        );
        assert_eq!(
            watch.heard(&neighbour_message(DEL, 41, &mut buf)),
            Some(false)
        );
        assert!(!watch.take_lost());
        assert_eq!(
            watch.heard(&neighbour_message(DEL, 40, &mut buf)),
            Some(true)
        );
        assert!(watch.take_lost());
        assert!(!watch.take_lost(), "taken once");
        // Not a neighbour notification (an RTM_NEWROUTE): for the other filters.
        assert_eq!(watch.heard(&neighbour_message(24, 40, &mut buf)), None);
    }

    fn state() -> HostState {
        HostState {
            address_mtus: vec![
                ("198.18.0.11".parse().unwrap(), 1460, "eth0".into()),
                ("fd00:18::11".parse().unwrap(), 1400, "eth1".into()),
            ],
            default_route_link: Some((9000, "bond0".into())),
            ..HostState::default()
        }
    }

    #[test]
    fn only_the_entries_the_agent_writes_are_kept() {
        let mac: MacAddr = "0a:58:c6:13:00:0d".parse().unwrap();
        let fdb = |flags: u8, dst: Option<&str>| FdbEntry {
            index: 4,
            mac,
            dst: dst.map(|d| d.parse().unwrap()),
            state: 0x80,
            flags,
            vni: None,
            port: None,
            master: None,
        };
        let neighbour = |ip: &str, state: u16, mac: Option<MacAddr>| Neighbour {
            index: 4,
            ip: ip.parse().unwrap(),
            mac,
            state,
            flags: 0,
        };
        let entries = DeviceEntries::of(
            &[
                fdb(0x02, Some("198.19.0.13")),
                fdb(0x00, Some("198.19.0.99")),
                fdb(0x02, None),
            ],
            &[
                neighbour("10.244.3.0", 0x80, Some(mac)),
                neighbour("10.244.9.0", 0x02, Some(mac)),
                neighbour("10.244.8.0", 0x80, None),
            ],
        );
        assert_eq!(
            entries.fdb.into_iter().collect::<Vec<_>>(),
            [(mac.0, "198.19.0.13".parse().unwrap())]
        );
        assert_eq!(
            entries.neighbours.into_iter().collect::<Vec<_>>(),
            [("10.244.3.0".parse().unwrap(), mac)]
        );
    }

    #[test]
    fn the_smaller_uplink_wins() {
        let ips = [
            "198.18.0.11".parse().unwrap(),
            "fd00:18::11".parse().unwrap(),
        ];
        let (mtu, why) = choose_mtu(&state(), &ips);
        assert_eq!(mtu, 1400);
        assert!(why.contains("eth1") && why.contains("fd00:18::11"), "{why}");
        let (mtu, _) = choose_mtu(&state(), &ips[..1]);
        assert_eq!(mtu, 1460);
    }

    #[test]
    fn without_a_local_internal_ip_the_default_route_decides() {
        let (mtu, why) = choose_mtu(&state(), &["203.0.113.1".parse().unwrap()]);
        assert_eq!(mtu, 9000);
        assert!(why.contains("bond0"), "{why}");
        let (mtu, why) = choose_mtu(&HostState::default(), &[]);
        assert_eq!(mtu, 1500);
        assert!(why.contains("default"), "{why}");
    }
}

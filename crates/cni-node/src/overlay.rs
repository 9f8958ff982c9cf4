//! The overlay's VXLAN devices: one per family that has an encapsulated peer, made,
//! adopted and repaired here; their per-peer entries and routes go in the route batch
//! ([`crate::routes`]).
//!
//! A device is the agent's when it has one of the agent's names (`<prefix>4`,
//! `<prefix>6`), is of kind `vxlan` and has the agent's VNI. Such a device is adopted
//! as it is on restart (same ifindex, its entries and routes kept, so no packet is
//! lost); one whose settings the kernel cannot change in place (port, local address,
//! uplink, learning, checksums) is made again; MTU, MAC, its VTEP address and up are
//! set in place. A link with one of the names that is not the agent's is never
//! touched: the family's tunnels wait, and the step fails saying why. Other VXLAN
//! devices (flannel's `flannel.1`, say) are never looked at.

use std::collections::BTreeMap;
use std::net::IpAddr;

use cni_linux::netlink::Link;
use cni_linux::{MacAddr, Netlink, Vxlan};
use ipnetwork::IpNetwork;

use crate::error::Error;
use crate::host::HostState;
use crate::plan::{OverlayDevice, OverlaySettings};

/// The device requests the overlay makes: a trait so the decisions are tested without
/// a kernel.
pub trait VxlanDevices: Send {
    /// Creates the device (down) and returns its index.
    fn create(&self, vxlan: &Vxlan<'_>) -> cni_linux::Result<u32>;
    /// Deletes a link.
    fn delete(&self, index: u32) -> cni_linux::Result<()>;
    /// Sets a link's MTU.
    fn set_mtu(&self, index: u32, mtu: u32) -> cni_linux::Result<()>;
    /// Sets a link's MAC address.
    fn set_mac(&self, index: u32, mac: MacAddr) -> cni_linux::Result<()>;
    /// Adds an address to a link.
    fn add_address(&self, index: u32, ip: IpNetwork) -> cni_linux::Result<()>;
    /// Sets a link up.
    fn set_up(&self, index: u32) -> cni_linux::Result<()>;
}

impl VxlanDevices for Netlink {
    fn create(&self, vxlan: &Vxlan<'_>) -> cni_linux::Result<u32> {
        self.create_vxlan(vxlan)?;
        Ok(self.require_link(vxlan.name)?.index)
    }
    fn delete(&self, index: u32) -> cni_linux::Result<()> {
        self.delete_link(index)
    }
    fn set_mtu(&self, index: u32, mtu: u32) -> cni_linux::Result<()> {
        Netlink::set_mtu(self, index, mtu)
    }
    fn set_mac(&self, index: u32, mac: MacAddr) -> cni_linux::Result<()> {
        Netlink::set_mac(self, index, mac)
    }
    fn add_address(&self, index: u32, ip: IpNetwork) -> cni_linux::Result<()> {
        Netlink::add_address(self, index, ip)
    }
    fn set_up(&self, index: u32) -> cni_linux::Result<()> {
        Netlink::set_up(self, index)
    }
}

/// A device ready for its entries and routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadyDevice {
    /// Its index.
    pub index: u32,
    /// Made in this pass: it holds no entries yet, whatever the host read said.
    pub fresh: bool,
}

/// What [`ensure`] did and found.
#[derive(Debug, Default)]
pub struct DeviceOutcome {
    /// The wanted devices that are ready, by family (`true`: IPv6).
    pub ready: BTreeMap<bool, ReadyDevice>,
    /// What was done, for the log: "created cni-vx4", "cni-vx6 up", ...
    pub done: Vec<String>,
    /// The agent's devices no longer wanted: deleted once the routes through them
    /// have moved ([`remove_stale`]).
    pub stale: Vec<(String, u32)>,
    /// What failed.
    pub failed: Vec<Error>,
}

/// Whether `link` (named like one of the agent's devices) is the agent's.
pub fn is_ours(link: &Link, vni: u32) -> bool {
    link.kind.as_deref() == Some("vxlan") && link.vxlan.is_some_and(|v| v.vni == vni)
}

/// Makes every device of `want` exist as planned, up, with its VTEP address.
pub fn ensure(
    devices: &dyn VxlanDevices,
    host: &HostState,
    want: &[OverlayDevice],
    settings: &OverlaySettings,
) -> DeviceOutcome {
    let mut out = DeviceOutcome::default();
    for device in want {
        match ensure_one(devices, host, device, &mut out.done) {
            Ok(ready) => {
                out.ready.insert(device.is_ipv6(), ready);
            }
            Err(e) => out.failed.push(e),
        }
    }
    for v6 in [false, true] {
        let name = settings.device_name(v6);
        if want.iter().any(|d| d.name == name) {
            continue;
        }
        if let Some(state) = host.overlay.iter().find(|s| s.link.name == name)
            && is_ours(&state.link, settings.vni)
        {
            out.stale.push((name, state.link.index));
        }
    }
    out
}

fn ensure_one(
    devices: &dyn VxlanDevices,
    host: &HostState,
    device: &OverlayDevice,
    done: &mut Vec<String>,
) -> Result<ReadyDevice, Error> {
    let name = device.name.as_str();
    let fail = |what: &'static str| {
        move |source| Error::Vxlan {
            name: name.to_owned(),
            what,
            source,
        }
    };
    let spec = Vxlan {
        name,
        vni: device.vni,
        local: Some(device.local),
        port: device.port,
        underlay: device.uplink,
        mtu: Some(device.mtu),
        mac: Some(device.mac),
    };
    let existing = host.overlay.iter().find(|s| s.link.name == name);
    let (index, fresh, addresses, up) = match existing {
        Some(state) if !is_ours(&state.link, device.vni) => {
            return Err(Error::ForeignDevice {
                name: name.to_owned(),
                what: describe(&state.link),
            });
        }
        Some(state) if spec.matches(&state.link) => {
            let link = &state.link;
            if link.mtu != device.mtu {
                devices
                    .set_mtu(link.index, device.mtu)
                    .map_err(fail("set the MTU of"))?;
                done.push(format!("{name} MTU {} -> {}", link.mtu, device.mtu));
            }
            if link.mac != Some(device.mac) {
                devices
                    .set_mac(link.index, device.mac)
                    .map_err(fail("set the MAC of"))?;
                done.push(format!("{name} MAC {}", device.mac));
            }
            (link.index, false, state.addresses.as_slice(), link.up)
        }
        Some(state) => {
            // Settings the kernel does not change in place: made again (its entries and
            // routes go with it and are programmed again in this pass).
            devices
                .delete(state.link.index)
                .map_err(fail("delete (to make again)"))?;
            let index = devices.create(&spec).map_err(fail("create"))?;
            done.push(format!(
                "made {name} again ({} -> {})",
                describe(&state.link),
                settings_text(&spec)
            ));
            (index, true, &[][..], false)
        }
        None => {
            let index = devices.create(&spec).map_err(fail("create"))?;
            done.push(format!("created {name} ({})", settings_text(&spec)));
            (index, true, &[][..], false)
        }
    };
    if !addresses.contains(&device.vtep) {
        match devices.add_address(index, IpNetwork::from(device.vtep)) {
            Ok(()) => done.push(format!("{name} VTEP address {}", device.vtep)),
            Err(e) if e.is_exists() => {}
            Err(e) => return Err(fail("add the VTEP address to")(e)),
        }
    }
    if !up {
        devices.set_up(index).map_err(fail("set up"))?;
        if !fresh {
            done.push(format!("{name} was down: set up"));
        }
    }
    Ok(ReadyDevice { index, fresh })
}

/// Deletes the agent's devices that no peer needs any more (their routes have moved
/// or gone in the batch before; the kernel drops their entries with them).
pub fn remove_stale(devices: &dyn VxlanDevices, stale: &[(String, u32)]) -> DeviceOutcome {
    let mut out = DeviceOutcome::default();
    for (name, index) in stale {
        match devices.delete(*index) {
            Ok(()) => out
                .done
                .push(format!("deleted {name}: no peer is encapsulated")),
            Err(e) if e.is_not_found() => {}
            Err(source) => out.failed.push(Error::Vxlan {
                name: name.clone(),
                what: "delete",
                source,
            }),
        }
    }
    out
}

fn settings_text(spec: &Vxlan<'_>) -> String {
    let local = spec
        .local
        .map_or_else(|| "any".to_owned(), |ip: IpAddr| ip.to_string());
    format!(
        "VNI {}, port {}, local {local}, MTU {}",
        spec.vni,
        spec.port,
        spec.mtu.unwrap_or_default()
    )
}

fn describe(link: &Link) -> String {
    match (&link.kind, &link.vxlan) {
        (Some(kind), Some(v)) => format!(
            "{kind}, VNI {}, port {}, local {}",
            v.vni,
            v.port,
            v.local
                .map_or_else(|| "any".to_owned(), |ip| ip.to_string())
        ),
        (Some(kind), None) => kind.clone(),
        (None, _) => "a link of no kind".to_owned(),
    }
}

/// Test doubles of the overlay's kernel side, shared by the agent's unit tests.
#[cfg(test)]
pub(crate) mod fakes {
    use std::net::IpAddr;

    use cni_linux::netlink::{Link, OperState, vtep_mac};
    use cni_linux::{MacAddr, Vxlan, VxlanInfo};
    use ipnetwork::IpNetwork;

    use super::VxlanDevices;
    use crate::host::DeviceState;

    /// Devices that accept every change and make device number 1.
    pub(crate) struct NoDevices;

    impl VxlanDevices for NoDevices {
        fn create(&self, _: &Vxlan<'_>) -> cni_linux::Result<u32> {
            Ok(1)
        }
        fn delete(&self, _: u32) -> cni_linux::Result<()> {
            Ok(())
        }
        fn set_mtu(&self, _: u32, _: u32) -> cni_linux::Result<()> {
            Ok(())
        }
        fn set_mac(&self, _: u32, _: MacAddr) -> cni_linux::Result<()> {
            Ok(())
        }
        fn add_address(&self, _: u32, _: IpNetwork) -> cni_linux::Result<()> {
            Ok(())
        }
        fn set_up(&self, _: u32) -> cni_linux::Result<()> {
            Ok(())
        }
    }

    /// A link as the host reader reports it: `kind` (a VXLAN device of `vni` over
    /// device 2 from `local`, when `kind` is `vxlan`), its MAC the one derived from
    /// `local`, addressed 10.244.1.0, its entries not read.
    pub(crate) fn device(
        index: u32,
        name: &str,
        kind: &str,
        vni: u32,
        local: IpAddr,
        mtu: u32,
        up: bool,
    ) -> DeviceState {
        DeviceState {
            link: Link {
                index,
                name: name.into(),
                mac: Some(vtep_mac(local)),
                mtu,
                kind: Some(kind.into()),
                controller: None,
                up,
                oper_state: OperState::Unknown,
                promisc: false,
                peer_index: None,
                link_netnsid: None,
                vlan_filtering: None,
                bridge_port: None,
                vxlan: (kind == "vxlan").then_some(VxlanInfo {
                    vni,
                    port: 4789,
                    local: Some(local),
                    underlay: Some(2),
                    learning: false,
                    udp_csum: true,
                    udp6_zero_csum_tx: false,
                    udp6_zero_csum_rx: false,
                }),
            },
            addresses: vec!["10.244.1.0".parse().unwrap()],
            entries: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use cni_linux::netlink::vtep_mac;

    use crate::host::DeviceState;

    #[derive(Default, Clone)]
    struct Recorder(Arc<Mutex<Vec<String>>>);
    impl VxlanDevices for Recorder {
        fn create(&self, v: &Vxlan<'_>) -> cni_linux::Result<u32> {
            self.0
                .lock()
                .unwrap()
                .push(format!("create {} vni {}", v.name, v.vni));
            Ok(40)
        }
        fn delete(&self, index: u32) -> cni_linux::Result<()> {
            self.0.lock().unwrap().push(format!("delete #{index}"));
            Ok(())
        }
        fn set_mtu(&self, index: u32, mtu: u32) -> cni_linux::Result<()> {
            self.0.lock().unwrap().push(format!("mtu #{index} {mtu}"));
            Ok(())
        }
        fn set_mac(&self, index: u32, mac: MacAddr) -> cni_linux::Result<()> {
            self.0.lock().unwrap().push(format!("mac #{index} {mac}"));
            Ok(())
        }
        fn add_address(&self, index: u32, ip: IpNetwork) -> cni_linux::Result<()> {
            self.0
                .lock()
                .unwrap()
                .push(format!("address #{index} {ip}"));
            Ok(())
        }
        fn set_up(&self, index: u32) -> cni_linux::Result<()> {
            self.0.lock().unwrap().push(format!("up #{index}"));
            Ok(())
        }
    }

    fn settings() -> OverlaySettings {
        OverlaySettings {
            enabled: true,
            vni: 4097,
            port: 4789,
            device_prefix: "cni-vx".into(),
        }
    }

    fn wanted() -> OverlayDevice {
        let local: IpAddr = "198.18.0.11".parse().unwrap();
        OverlayDevice {
            name: "cni-vx4".into(),
            vni: 4097,
            port: 4789,
            local,
            uplink: Some(2),
            mac: vtep_mac(local),
            vtep: "10.244.1.0".parse().unwrap(),
            mtu: 1450,
        }
    }

    fn link(name: &str, kind: &str, vni: u32, local: &str, up: bool) -> DeviceState {
        super::fakes::device(7, name, kind, vni, local.parse().unwrap(), 1450, up)
    }

    fn run(host: &HostState, want: &[OverlayDevice]) -> (DeviceOutcome, Vec<String>) {
        let rec = Recorder::default();
        let out = ensure(&rec, host, want, &settings());
        let log = rec.0.lock().unwrap().clone();
        (out, log)
    }

    #[test]
    fn a_missing_device_is_created_addressed_and_set_up() {
        let (out, log) = run(&HostState::default(), &[wanted()]);
        assert_eq!(
            log,
            [
                "create cni-vx4 vni 4097",
                "address #40 10.244.1.0/32",
                "up #40"
            ]
        );
        assert_eq!(
            out.ready[&false],
            ReadyDevice {
                index: 40,
                fresh: true
            }
        );
    }

    #[test]
    fn an_existing_device_is_adopted_as_it_is() {
        let host = HostState {
            overlay: vec![link("cni-vx4", "vxlan", 4097, "198.18.0.11", true)],
            ..HostState::default()
        };
        let (out, log) = run(&host, &[wanted()]);
        assert!(log.is_empty(), "{log:?}");
        assert_eq!(
            out.ready[&false],
            ReadyDevice {
                index: 7,
                fresh: false
            }
        );
        // Downed by hand: set up again, same device.
        let mut down = host.clone();
        down.overlay[0].link.up = false;
        let (_, log) = run(&down, &[wanted()]);
        assert_eq!(log, ["up #7"]);
    }

    #[test]
    fn a_changed_local_address_makes_the_device_again() {
        let host = HostState {
            overlay: vec![link("cni-vx4", "vxlan", 4097, "198.18.0.99", true)],
            ..HostState::default()
        };
        let (out, log) = run(&host, &[wanted()]);
        assert_eq!(
            log[..2],
            ["delete #7".to_owned(), "create cni-vx4 vni 4097".to_owned()]
        );
        assert!(out.ready[&false].fresh);
    }

    #[test]
    fn a_foreign_link_with_our_name_is_left_alone_and_reported() {
        for state in [
            link("cni-vx4", "vxlan", 1, "198.18.0.11", true),
            link("cni-vx4", "veth", 0, "198.18.0.11", true),
        ] {
            let host = HostState {
                overlay: vec![state],
                ..HostState::default()
            };
            let (out, log) = run(&host, &[wanted()]);
            assert!(log.is_empty(), "{log:?}");
            assert!(out.ready.is_empty());
            let text = crate::error::chain(&out.failed[0]);
            assert!(text.contains("not this agent's"), "{text}");
            // Not wanted: still not touched.
            let (out, _) = run(&host, &[]);
            assert!(out.stale.is_empty());
        }
    }

    #[test]
    fn our_unwanted_device_is_stale() {
        let host = HostState {
            overlay: vec![link("cni-vx4", "vxlan", 4097, "198.18.0.11", true)],
            ..HostState::default()
        };
        let (out, log) = run(&host, &[]);
        assert!(log.is_empty());
        assert_eq!(out.stale, [("cni-vx4".to_owned(), 7)]);
        let rec = Recorder::default();
        let removed = remove_stale(&rec, &out.stale);
        assert!(removed.failed.is_empty());
        assert_eq!(*rec.0.lock().unwrap(), ["delete #7"]);
    }
}

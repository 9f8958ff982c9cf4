//! An in-memory [`Links`] and [`Effects`] for unit tests: a host and a pod namespace
//! with links, addresses, routes, port VLANs and per-link sysctls, the host's IPAM
//! reservations, firewall rules, pod records and pending addresses, behaving like the kernel where
//! the bridge depends on it (EEXIST for a taken name, a veth's peer going with it,
//! a link's sysctls and addresses going with the link). Any one call can be made to
//! fail, to test what ADD leaves behind after a failure at each step.

use crate::effects::{self, Effects};
use crate::links::Links;
use cni_firewall::Backend;
use cni_linux::{
    Address, AddressOptions, BridgePort, Errno, Error, Family, Link, MacAddr, NetNs, OperState,
    Result, Route, VethPair, VlanEntry,
};
use cni_protocol::error::internal;
use cni_protocol::pod_record::PodRecord;
use cni_protocol::{CniError, CniResult, Request};
use ipnetwork::IpNetwork;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

/// What one namespace holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Namespace {
    pub links: BTreeMap<u32, Link>,
    pub addresses: Vec<Address>,
    pub routes: Vec<Route>,
    pub vlans: BTreeMap<u32, Vec<VlanEntry>>,
    pub sysctls: BTreeMap<String, String>,
    /// IPAM's addresses by container id (the IPAM store lives on the host).
    pub reservations: BTreeMap<String, Vec<IpNetwork>>,
    /// Firewall rules, one line each, starting with the attachment they belong to.
    pub rules: BTreeSet<String>,
    /// Pod records by address: `(namespace/name, container id, published)`.
    pub pod_records: BTreeMap<IpAddr, (String, String, bool)>,
    /// The NetworkPolicy table's pending addresses; `None` when there is no table.
    pub pending: Option<BTreeSet<IpAddr>>,
}

impl Namespace {
    fn by_name(&self, name: &str) -> Option<&Link> {
        self.links.values().find(|l| l.name == name)
    }

    /// Removes a link with everything that lives and dies with it.
    fn remove(&mut self, index: u32) -> Option<Link> {
        let link = self.links.remove(&index)?;
        self.addresses.retain(|a| a.index != index);
        self.routes.retain(|r| r.oif != Some(index));
        self.vlans.remove(&index);
        let marker = format!("/{}/", link.name);
        self.sysctls.retain(|k, _| !k.contains(&marker));
        Some(link)
    }
}

/// Both namespaces, and the next free interface index.
#[derive(Debug, Default)]
pub(crate) struct World {
    pub host: Namespace,
    pub pod: Namespace,
    /// What the fake IPAM plugin hands out on ADD; `None` makes IPAM fail.
    pub ipam: Option<CniResult>,
    next_index: u32,
}

#[derive(Debug, Default)]
struct Shared {
    world: RefCell<World>,
    calls: Cell<usize>,
    fail_at: Cell<Option<usize>>,
    log: RefCell<Vec<String>>,
}

/// A handle on one namespace of a shared [`World`].
#[derive(Debug, Clone)]
pub(crate) struct Fake {
    shared: Rc<Shared>,
    pod: bool,
}

/// A fake link of `kind`, down, with a MAC derived from its index.
pub(crate) fn link(index: u32, name: &str, kind: &str) -> Link {
    let [a, b, c, d] = index.to_be_bytes();
    Link {
        index,
        name: name.to_string(),
        mac: Some(MacAddr([0x02, 0xfa, a, b, c, d])),
        mtu: 1500,
        kind: Some(kind.to_string()),
        controller: None,
        up: false,
        oper_state: OperState::Down,
        promisc: false,
        peer_index: None,
        link_netnsid: None,
        vlan_filtering: None,
        bridge_port: None,
        vxlan: None,
    }
}

fn kernel(errno: Errno, what: &str) -> Error {
    Error::Netlink {
        context: what.to_string(),
        source: std::io::Error::from_raw_os_error(errno as i32),
    }
}

impl Fake {
    /// The host and pod handles of a new, empty world.
    pub(crate) fn pair() -> (Fake, Fake) {
        let shared = Rc::new(Shared::default());
        shared.world.borrow_mut().next_index = 10;
        let host = Fake {
            shared: Rc::clone(&shared),
            pod: false,
        };
        let pod = Fake { shared, pod: true };
        (host, pod)
    }

    /// Both namespaces as they are now.
    pub(crate) fn snapshot(&self) -> (Namespace, Namespace) {
        let w = self.shared.world.borrow();
        (w.host.clone(), w.pod.clone())
    }

    /// Changes the world directly (test setup).
    pub(crate) fn with_world<T>(&self, f: impl FnOnce(&mut World) -> T) -> T {
        f(&mut self.shared.world.borrow_mut())
    }

    /// A fresh interface index.
    pub(crate) fn next_index(&self) -> u32 {
        let mut w = self.shared.world.borrow_mut();
        w.next_index += 1;
        w.next_index
    }

    /// Makes call number `n` (counted from 0 from now on, over both handles) fail
    /// with EPERM; `None` makes every call succeed.
    pub(crate) fn fail_at(&self, n: Option<usize>) {
        self.shared.calls.set(0);
        self.shared.fail_at.set(n);
        self.shared.log.borrow_mut().clear();
    }

    /// The calls made since the last [`Fake::fail_at`], by name, the failed one
    /// marked `!`.
    pub(crate) fn log(&self) -> Vec<String> {
        self.shared.log.borrow().clone()
    }

    /// Counts a call and fails it if it is the chosen one.
    fn step(&self, what: &str) -> Result<()> {
        let n = self.shared.calls.get();
        self.shared.calls.set(n + 1);
        let fail = self.shared.fail_at.get() == Some(n);
        let mark = if fail { "!" } else { "" };
        let side = if self.pod { "pod" } else { "host" };
        self.shared
            .log
            .borrow_mut()
            .push(format!("{mark}{side}:{what}"));
        if fail {
            return Err(kernel(Errno::EPERM, &format!("injected failure: {what}")));
        }
        Ok(())
    }

    fn ns<T>(&self, f: impl FnOnce(&mut Namespace) -> T) -> T {
        let mut w = self.shared.world.borrow_mut();
        f(if self.pod { &mut w.pod } else { &mut w.host })
    }

    fn change(&self, what: &str, index: u32, f: impl FnOnce(&mut Link)) -> Result<()> {
        self.step(what)?;
        self.ns(|ns| match ns.links.get_mut(&index) {
            Some(link) => {
                f(link);
                Ok(())
            }
            None => Err(kernel(Errno::ENODEV, what)),
        })
    }
}

impl Links for Fake {
    fn link_by_name(&self, name: &str) -> Result<Option<Link>> {
        self.step("link_by_name")?;
        Ok(self.ns(|ns| ns.by_name(name).cloned()))
    }

    fn require_link(&self, name: &str) -> Result<Link> {
        self.step("require_link")?;
        self.ns(|ns| ns.by_name(name).cloned())
            .ok_or_else(|| Error::LinkNotFound {
                name: name.to_string(),
            })
    }

    fn create_bridge(&self, name: &str, mtu: Option<u32>, vlan_filtering: bool) -> Result<()> {
        self.step("create_bridge")?;
        if self.ns(|ns| ns.by_name(name).is_some()) {
            return Err(kernel(Errno::EEXIST, "create_bridge"));
        }
        let mut bridge = link(self.next_index(), name, "bridge");
        bridge.mtu = mtu.unwrap_or(1500);
        bridge.vlan_filtering = Some(vlan_filtering);
        self.ns(|ns| ns.links.insert(bridge.index, bridge));
        Ok(())
    }

    fn create_veth(&self, pair: &VethPair<'_>) -> Result<()> {
        self.step("create_veth")?;
        let peer_in_pod = pair.peer_netns.is_some();
        let taken = {
            let w = self.shared.world.borrow();
            let here = if self.pod { &w.pod } else { &w.host };
            let there = if peer_in_pod { &w.pod } else { here };
            here.by_name(pair.name).is_some() || there.by_name(pair.peer_name).is_some()
        };
        if taken {
            return Err(kernel(Errno::EEXIST, "create_veth"));
        }
        let (index, peer_index) = (self.next_index(), self.next_index());
        let mut end = link(index, pair.name, "veth");
        end.mtu = pair.mtu.unwrap_or(1500);
        end.peer_index = Some(peer_index);
        end.controller = pair.controller;
        if pair.controller.is_some() {
            end.bridge_port = Some(BridgePort::default());
        }
        let mut peer = link(peer_index, pair.peer_name, "veth");
        peer.mtu = pair.peer_mtu.unwrap_or(1500);
        peer.peer_index = Some(index);
        if let Some(mac) = pair.peer_mac {
            peer.mac = Some(mac);
        }
        let mut w = self.shared.world.borrow_mut();
        let filtering = pair.controller.is_some_and(|c| {
            let here = if self.pod { &w.pod } else { &w.host };
            here.links.get(&c).and_then(|b| b.vlan_filtering) == Some(true)
        });
        let here = if self.pod { &mut w.pod } else { &mut w.host };
        if filtering {
            // The kernel puts a new port of a VLAN-filtering bridge in VLAN 1.
            here.vlans.insert(
                index,
                vec![VlanEntry {
                    vid: 1,
                    pvid: true,
                    untagged: true,
                }],
            );
        }
        here.links.insert(index, end);
        let there = if peer_in_pod { &mut w.pod } else { here };
        there.links.insert(peer_index, peer);
        Ok(())
    }

    fn delete_link_by_name(&self, name: &str) -> Result<bool> {
        self.step("delete_link_by_name")?;
        let mut w = self.shared.world.borrow_mut();
        let World { host, pod, .. } = &mut *w;
        let (here, other) = if self.pod { (pod, host) } else { (host, pod) };
        let Some(index) = here.by_name(name).map(|l| l.index) else {
            return Ok(false);
        };
        let link = here.remove(index).expect("found above");
        // A veth's peer goes with it, wherever it is.
        if let Some(peer) = link
            .peer_index
            .filter(|_| link.kind.as_deref() == Some("veth"))
            && here.remove(peer).is_none()
        {
            other.remove(peer);
        }
        Ok(true)
    }

    fn set_up(&self, index: u32) -> Result<()> {
        self.change("set_up", index, |l| {
            l.up = true;
            l.oper_state = OperState::Up;
        })
    }

    /// Recorded as the sysctl it sets.
    fn set_arp_notify(&self, index: u32) -> Result<()> {
        self.step("set_arp_notify")?;
        self.ns(|ns| {
            let name = ns
                .links
                .get(&index)
                .map(|l| l.name.clone())
                .ok_or_else(|| kernel(Errno::ENODEV, "set_arp_notify"))?;
            ns.sysctls
                .insert(format!("net/ipv4/conf/{name}/arp_notify"), "1".into());
            Ok(())
        })
    }

    fn set_promisc(&self, index: u32, on: bool) -> Result<()> {
        self.change("set_promisc", index, |l| l.promisc = on)
    }

    fn set_mac(&self, index: u32, mac: MacAddr) -> Result<()> {
        self.change("set_mac", index, |l| l.mac = Some(mac))
    }

    fn set_port_hairpin(&self, index: u32, on: bool) -> Result<()> {
        self.change("set_port_hairpin", index, |l| {
            l.bridge_port
                .get_or_insert_with(BridgePort::default)
                .hairpin = on;
        })
    }

    fn set_port_isolated(&self, index: u32, on: bool) -> Result<()> {
        self.change("set_port_isolated", index, |l| {
            l.bridge_port
                .get_or_insert_with(BridgePort::default)
                .isolated = on;
        })
    }

    fn set_port_flags(&self, index: u32, hairpin: bool, isolated: bool) -> Result<()> {
        self.change("set_port_flags", index, |l| {
            let port = l.bridge_port.get_or_insert_with(BridgePort::default);
            port.hairpin = hairpin;
            port.isolated = isolated;
        })
    }

    fn port_vlans(&self, index: u32) -> Result<Vec<VlanEntry>> {
        self.step("port_vlans")?;
        Ok(self.ns(|ns| ns.vlans.get(&index).cloned().unwrap_or_default()))
    }

    fn add_port_vlan(&self, index: u32, vid: u16, pvid: bool, untagged: bool) -> Result<()> {
        self.step("add_port_vlan")?;
        self.ns(|ns| {
            let vlans = ns.vlans.entry(index).or_default();
            if pvid {
                vlans.iter_mut().for_each(|v| v.pvid = false);
            }
            vlans.retain(|v| v.vid != vid);
            vlans.push(VlanEntry {
                vid,
                pvid,
                untagged,
            });
        });
        Ok(())
    }

    fn del_port_vlan(&self, index: u32, vid: u16) -> Result<()> {
        self.step("del_port_vlan")?;
        self.ns(|ns| {
            if let Some(vlans) = ns.vlans.get_mut(&index) {
                vlans.retain(|v| v.vid != vid);
            }
        });
        Ok(())
    }

    fn wait_oper_up(&self, index: u32, _delays: &[Duration]) -> Result<Link> {
        self.step("wait_oper_up")?;
        match self.ns(|ns| ns.links.get(&index).cloned()) {
            Some(link) if link.up => Ok(link),
            Some(link) => Err(Error::LinkNotUp {
                link: link.name,
                state: link.oper_state,
            }),
            None => Err(kernel(Errno::ENODEV, "wait_oper_up")),
        }
    }

    fn addresses(&self, index: u32, family: Option<Family>) -> Result<Vec<Address>> {
        self.step("addresses")?;
        Ok(self.ns(|ns| {
            ns.addresses
                .iter()
                .filter(|a| a.index == index)
                .filter(|a| family.is_none_or(|f| f == Family::of(a.ip.ip())))
                .copied()
                .collect()
        }))
    }

    fn add_address(&self, index: u32, ip: IpNetwork, options: AddressOptions) -> Result<()> {
        self.step("add_address")?;
        self.ns(|ns| {
            if ns.addresses.iter().any(|a| a.index == index && a.ip == ip) {
                return Err(kernel(Errno::EEXIST, "add_address"));
            }
            // As the kernel keeps it: IFA_F_NODAD (linux/if_addr.h) on an IPv6 address
            // added without DAD; IPv4 has none.
            const IFA_F_NODAD: u32 = 0x02;
            ns.addresses.push(Address {
                ip,
                index,
                scope: 0,
                flags: if options.skip_dad && ip.is_ipv6() {
                    IFA_F_NODAD
                } else {
                    0
                },
            });
            Ok(())
        })
    }

    fn del_address(&self, index: u32, ip: IpNetwork) -> Result<()> {
        self.step("del_address")?;
        self.ns(|ns| ns.addresses.retain(|a| !(a.index == index && a.ip == ip)));
        Ok(())
    }

    fn wait_addresses_settled(&self, _index: u32, _timeout: Duration) -> Result<()> {
        self.step("wait_addresses_settled")
    }

    fn add_route(&self, route: &Route) -> Result<()> {
        self.step("add_route")?;
        self.ns(|ns| {
            if ns
                .routes
                .iter()
                .any(|r| r.dst == route.dst && r.table == route.table)
            {
                return Err(kernel(Errno::EEXIST, "add_route"));
            }
            ns.routes.push(*route);
            Ok(())
        })
    }

    fn routes(&self, family: Family, _table: Option<u32>) -> Result<Vec<Route>> {
        self.step("routes")?;
        Ok(self.ns(|ns| {
            ns.routes
                .iter()
                .filter(|r| Family::of(r.dst.ip()) == family)
                .copied()
                .collect()
        }))
    }

    /// Not a step of its own: a failed read only means the sysctl is written.
    fn forwarding(&self, family: Family) -> Result<bool> {
        let name = match family {
            Family::V4 => "net/ipv4/ip_forward",
            Family::V6 => "net/ipv6/conf/all/forwarding",
        };
        Ok(self.ns(|ns| ns.sysctls.get(name).is_some_and(|v| v == "1")))
    }

    fn write_sysctl(&self, name: &str, value: &str) -> Result<()> {
        self.step("write_sysctl")?;
        self.ns(|ns| {
            // Per-link sysctls exist only while the link does.
            let per_link = name
                .strip_prefix("net/ipv6/conf/")
                .or_else(|| name.strip_prefix("net/ipv4/conf/"))
                .and_then(|rest| rest.split_once('/'))
                .map(|(dev, _)| dev)
                .filter(|dev| *dev != "all" && *dev != "default");
            if per_link.is_some_and(|dev| ns.by_name(dev).is_none()) {
                return Err(kernel(Errno::ENOENT, "write_sysctl"));
            }
            ns.sysctls.insert(name.to_string(), value.to_string());
            Ok(())
        })
    }
}

impl Fake {
    /// Counts an effect and fails it like [`Fake::step`], as the plugin sees it.
    fn effect(&self, what: &str) -> std::result::Result<(), CniError> {
        self.step(what).map_err(|e| internal(&e))
    }

    fn host<T>(&self, f: impl FnOnce(&mut Namespace) -> T) -> T {
        f(&mut self.shared.world.borrow_mut().host)
    }
}

/// The rules of one attachment start with `{kind} {container_id} {ifname} `.
fn rule_prefix(kind: &str, container_id: &str, ifname: &str) -> String {
    format!("{kind} {container_id} {ifname} ")
}

impl Effects for Fake {
    fn ipam_add(&self, req: &Request) -> std::result::Result<CniResult, CniError> {
        self.effect("ipam_add")?;
        let result = self
            .shared
            .world
            .borrow()
            .ipam
            .clone()
            .ok_or_else(|| CniError::internal("no addresses left"))?;
        let ips = result.ips.iter().map(|ip| ip.address).collect();
        self.host(|ns| ns.reservations.insert(req.args.container_id.clone(), ips));
        Ok(result)
    }

    fn ipam_del(&self, req: &Request) -> std::result::Result<(), CniError> {
        self.effect("ipam_del")?;
        self.host(|ns| ns.reservations.remove(&req.args.container_id));
        Ok(())
    }

    fn macspoof_setup(
        &self,
        container_id: &str,
        ifname: &str,
        host_veth: &str,
        container_mac: Option<MacAddr>,
    ) -> std::result::Result<(), CniError> {
        self.effect("macspoof_setup")?;
        let mac = container_mac.ok_or_else(|| CniError::internal("no container MAC"))?;
        let prefix = rule_prefix("macspoof", container_id, ifname);
        self.host(|ns| {
            ns.rules.retain(|r| !r.starts_with(&prefix));
            ns.rules
                .insert(format!("{prefix}iif {host_veth} ether saddr != {mac} drop"));
        });
        Ok(())
    }

    fn macspoof_teardown(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> std::result::Result<(), CniError> {
        self.effect("macspoof_teardown")?;
        let prefix = rule_prefix("macspoof", container_id, ifname);
        self.host(|ns| ns.rules.retain(|r| !r.starts_with(&prefix)));
        Ok(())
    }

    fn port_security_setup(
        &self,
        port: &effects::PortSecurity,
    ) -> std::result::Result<(), CniError> {
        self.effect("port_security_setup")?;
        let prefix = rule_prefix("portsec", &port.container_id, &port.ifname);
        self.host(|ns| {
            ns.rules.retain(|r| !r.starts_with(&prefix));
            ns.rules.insert(format!(
                "{prefix}iif {} from {} {:?}",
                port.host_veth, port.mac, port.addresses
            ));
        });
        Ok(())
    }

    fn port_security_teardown(
        &self,
        container_id: &str,
        ifname: &str,
    ) -> std::result::Result<(), CniError> {
        self.effect("port_security_teardown")?;
        let prefix = rule_prefix("portsec", container_id, ifname);
        self.host(|ns| ns.rules.retain(|r| !r.starts_with(&prefix)));
        Ok(())
    }

    fn masq_setup(
        &self,
        backend: Backend,
        network: &str,
        ifname: &str,
        container_id: &str,
        nets: &[IpNetwork],
    ) -> std::result::Result<(), CniError> {
        self.effect("masq_setup")?;
        let prefix = rule_prefix("masq", container_id, ifname);
        self.host(|ns| {
            for net in nets {
                ns.rules.insert(format!(
                    "{prefix}{network} {backend:?} saddr {} masquerade",
                    net.ip()
                ));
            }
        });
        Ok(())
    }

    fn masq_teardown(
        &self,
        _network: &str,
        ifname: &str,
        container_id: &str,
    ) -> std::result::Result<(), CniError> {
        self.effect("masq_teardown")?;
        let prefix = rule_prefix("masq", container_id, ifname);
        self.host(|ns| ns.rules.retain(|r| !r.starts_with(&prefix)));
        Ok(())
    }

    fn pod_record_stage(
        &self,
        _dir: &Path,
        ips: &[IpAddr],
        record: &PodRecord,
    ) -> std::result::Result<(), CniError> {
        self.effect("pod_record_stage")?;
        self.host(|ns| {
            for ip in ips {
                let entry = (record.pod.clone(), record.container_id.clone(), false);
                ns.pod_records.insert(*ip, entry);
            }
        });
        Ok(())
    }

    fn pod_record_publish(&self, _dir: &Path, ips: &[IpAddr]) -> std::result::Result<(), CniError> {
        self.effect("pod_record_publish")?;
        self.host(|ns| {
            for ip in ips {
                match ns.pod_records.get_mut(ip) {
                    Some(record) => record.2 = true,
                    None => return Err(CniError::internal(format!("no staged record of {ip}"))),
                }
            }
            Ok(())
        })
    }

    fn pod_record_remove(
        &self,
        _dir: &Path,
        ips: &[IpAddr],
        container_id: &str,
    ) -> std::result::Result<(), CniError> {
        self.effect("pod_record_remove")?;
        self.host(|ns| {
            ns.pod_records
                .retain(|ip, (_, id, _)| !(ips.contains(ip) && id == container_id));
        });
        Ok(())
    }

    fn pending_add(&self, ips: &[IpAddr], _pod: &str) -> std::result::Result<bool, CniError> {
        self.effect("pending_add")?;
        Ok(self.host(|ns| {
            ns.pending
                .as_mut()
                .map(|pending| pending.extend(ips.iter().copied()))
                .is_some()
        }))
    }

    fn pending_remove(&self, ips: &[IpAddr]) -> std::result::Result<(), CniError> {
        self.effect("pending_remove")?;
        self.host(|ns| {
            if let Some(pending) = ns.pending.as_mut() {
                pending.retain(|ip| !ips.contains(ip));
            }
        });
        Ok(())
    }

    /// The real sequence of writes, each a call on the pod's namespace.
    fn container_sysctls(
        &self,
        _pod_ns: &NetNs,
        ifname: &str,
        settings: effects::ContainerSysctls,
    ) -> std::result::Result<(), CniError> {
        let pod = Fake {
            shared: Rc::clone(&self.shared),
            pod: true,
        };
        effects::container_sysctls(|n, v| pod.write_sysctl(n, v), ifname, settings)
    }
}

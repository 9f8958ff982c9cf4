//! The netlink (and per-link sysctl) operations ADD and CHECK perform, behind a small
//! trait: [`Netlink`] is the real implementation, and the unit tests use an in-memory
//! fake (`fake.rs`) so step order, rollback and CHECK's verdicts are tested without
//! root. One value of the trait talks to one network namespace.

use cni_linux::{
    Address, AddressOptions, Family, Link, MacAddr, NetNs, NetNsLock, Netlink, Result, Route,
    VethPair, VlanEntry,
};
use ipnetwork::IpNetwork;
use std::time::Duration;

/// Links, addresses, routes and bridge-port settings of one network namespace.
pub(crate) trait Links {
    fn link_by_name(&self, name: &str) -> Result<Option<Link>>;
    fn require_link(&self, name: &str) -> Result<Link>;
    fn create_bridge(&self, name: &str, mtu: Option<u32>, vlan_filtering: bool) -> Result<()>;
    fn create_veth(&self, pair: &VethPair<'_>) -> Result<()>;
    /// `Ok(false)` when the link did not exist.
    fn delete_link_by_name(&self, name: &str) -> Result<bool>;
    fn set_up(&self, index: u32) -> Result<()>;
    fn set_promisc(&self, index: u32, on: bool) -> Result<()>;
    /// Turns the link's `net.ipv4.conf.<link>.arp_notify` on.
    fn set_arp_notify(&self, index: u32) -> Result<()>;
    fn set_mac(&self, index: u32, mac: MacAddr) -> Result<()>;
    fn set_port_hairpin(&self, index: u32, on: bool) -> Result<()>;
    fn set_port_isolated(&self, index: u32, on: bool) -> Result<()>;
    /// Both port flags; one request where the kernel takes them together.
    fn set_port_flags(&self, index: u32, hairpin: bool, isolated: bool) -> Result<()> {
        self.set_port_hairpin(index, hairpin)?;
        self.set_port_isolated(index, isolated)
    }
    fn port_vlans(&self, index: u32) -> Result<Vec<VlanEntry>>;
    fn add_port_vlan(&self, index: u32, vid: u16, pvid: bool, untagged: bool) -> Result<()>;
    fn del_port_vlan(&self, index: u32, vid: u16) -> Result<()>;
    fn wait_oper_up(&self, index: u32, delays: &[Duration]) -> Result<Link>;
    fn addresses(&self, index: u32, family: Option<Family>) -> Result<Vec<Address>>;
    fn add_address(&self, index: u32, ip: IpNetwork, options: AddressOptions) -> Result<()>;
    fn del_address(&self, index: u32, ip: IpNetwork) -> Result<()>;
    fn wait_addresses_settled(&self, index: u32, timeout: Duration) -> Result<()>;
    fn add_route(&self, route: &Route) -> Result<()>;
    fn routes(&self, family: Family, table: Option<u32>) -> Result<Vec<Route>>;
    /// Whether forwarding is on for `family` (`net.ipv4.ip_forward`,
    /// `net.ipv6.conf.all.forwarding`), asked over netlink.
    fn forwarding(&self, family: Family) -> Result<bool>;
    /// Writes a sysctl of this namespace. Only used on the host handle, whose
    /// namespace is the calling thread's.
    fn write_sysctl(&self, name: &str, value: &str) -> Result<()>;
    /// Holds off every other plugin run's lock of this namespace until the guard drops.
    /// Only used on the host handle, whose namespace is the calling thread's; `None`
    /// where nothing else can run beside (the unit tests' fake).
    fn lock_namespace(&self) -> Result<Option<NetNsLock>> {
        Ok(None)
    }
}

impl Links for Netlink {
    fn link_by_name(&self, name: &str) -> Result<Option<Link>> {
        Netlink::link_by_name(self, name)
    }
    fn require_link(&self, name: &str) -> Result<Link> {
        Netlink::require_link(self, name)
    }
    fn create_bridge(&self, name: &str, mtu: Option<u32>, vlan_filtering: bool) -> Result<()> {
        Netlink::create_bridge(self, name, mtu, vlan_filtering)
    }
    fn create_veth(&self, pair: &VethPair<'_>) -> Result<()> {
        Netlink::create_veth(self, pair)
    }
    fn delete_link_by_name(&self, name: &str) -> Result<bool> {
        Netlink::delete_link_by_name(self, name)
    }
    fn set_up(&self, index: u32) -> Result<()> {
        Netlink::set_up(self, index)
    }
    fn set_promisc(&self, index: u32, on: bool) -> Result<()> {
        Netlink::set_promisc(self, index, on)
    }
    fn set_arp_notify(&self, index: u32) -> Result<()> {
        Netlink::set_arp_notify(self, index, true)
    }
    fn set_mac(&self, index: u32, mac: MacAddr) -> Result<()> {
        Netlink::set_mac(self, index, mac)
    }
    fn set_port_hairpin(&self, index: u32, on: bool) -> Result<()> {
        Netlink::set_port_hairpin(self, index, on)
    }
    fn set_port_isolated(&self, index: u32, on: bool) -> Result<()> {
        Netlink::set_port_isolated(self, index, on)
    }
    fn set_port_flags(&self, index: u32, hairpin: bool, isolated: bool) -> Result<()> {
        Netlink::set_port_flags(self, index, hairpin, isolated)
    }
    fn port_vlans(&self, index: u32) -> Result<Vec<VlanEntry>> {
        Netlink::port_vlans(self, index)
    }
    fn add_port_vlan(&self, index: u32, vid: u16, pvid: bool, untagged: bool) -> Result<()> {
        Netlink::add_port_vlan(self, index, vid, pvid, untagged)
    }
    fn del_port_vlan(&self, index: u32, vid: u16) -> Result<()> {
        Netlink::del_port_vlan(self, index, vid)
    }
    fn wait_oper_up(&self, index: u32, delays: &[Duration]) -> Result<Link> {
        Netlink::wait_oper_up(self, index, delays)
    }
    fn addresses(&self, index: u32, family: Option<Family>) -> Result<Vec<Address>> {
        Netlink::addresses(self, index, family)
    }
    fn add_address(&self, index: u32, ip: IpNetwork, options: AddressOptions) -> Result<()> {
        Netlink::add_address_with(self, index, ip, options)
    }
    fn del_address(&self, index: u32, ip: IpNetwork) -> Result<()> {
        Netlink::del_address(self, index, ip)
    }
    fn wait_addresses_settled(&self, index: u32, timeout: Duration) -> Result<()> {
        Netlink::wait_addresses_settled(self, index, timeout)
    }
    fn add_route(&self, route: &Route) -> Result<()> {
        Netlink::add_route(self, route)
    }
    fn routes(&self, family: Family, table: Option<u32>) -> Result<Vec<Route>> {
        Netlink::routes(self, family, table)
    }
    fn forwarding(&self, family: Family) -> Result<bool> {
        Netlink::forwarding(self, family)
    }
    fn write_sysctl(&self, name: &str, value: &str) -> Result<()> {
        cni_linux::sysctl::write(name, value)
    }
    fn lock_namespace(&self) -> Result<Option<NetNsLock>> {
        NetNs::current()?.lock().map(Some)
    }
}

//! The netlink (and per-link sysctl) operations ADD and CHECK perform, behind a small
//! trait: [`Netlink`] is the real implementation, and the unit tests use an in-memory
//! fake (`fake.rs`) so step order, rollback and CHECK's verdicts are tested without
//! root. One value of the trait talks to one network namespace.

use cni_linux::{Address, Family, Link, MacAddr, Netlink, Result, Route, VethPair, VlanEntry};
use ipnetwork::IpNetwork;
use std::time::Duration;

/// Links, addresses, routes and bridge-port settings of one network namespace.
pub(crate) trait Links {
    async fn link_by_name(&self, name: &str) -> Result<Option<Link>>;
    async fn require_link(&self, name: &str) -> Result<Link>;
    async fn create_bridge(&self, name: &str, mtu: Option<u32>, vlan_filtering: bool)
    -> Result<()>;
    async fn create_veth(&self, pair: &VethPair<'_>) -> Result<()>;
    /// `Ok(false)` when the link did not exist.
    async fn delete_link_by_name(&self, name: &str) -> Result<bool>;
    async fn set_up(&self, index: u32) -> Result<()>;
    async fn set_promisc(&self, index: u32, on: bool) -> Result<()>;
    async fn set_mac(&self, index: u32, mac: MacAddr) -> Result<()>;
    async fn set_port_hairpin(&self, index: u32, on: bool) -> Result<()>;
    async fn set_port_isolated(&self, index: u32, on: bool) -> Result<()>;
    /// Both port flags; one request where the kernel takes them together.
    async fn set_port_flags(&self, index: u32, hairpin: bool, isolated: bool) -> Result<()> {
        self.set_port_hairpin(index, hairpin).await?;
        self.set_port_isolated(index, isolated).await
    }
    async fn port_vlans(&self, index: u32) -> Result<Vec<VlanEntry>>;
    async fn add_port_vlan(&self, index: u32, vid: u16, pvid: bool, untagged: bool) -> Result<()>;
    async fn del_port_vlan(&self, index: u32, vid: u16) -> Result<()>;
    async fn wait_oper_up(&self, index: u32, delays: &[Duration]) -> Result<Link>;
    async fn addresses(&self, index: u32, family: Option<Family>) -> Result<Vec<Address>>;
    async fn add_address(&self, index: u32, ip: IpNetwork) -> Result<()>;
    async fn del_address(&self, index: u32, ip: IpNetwork) -> Result<()>;
    async fn wait_addresses_settled(&self, index: u32, timeout: Duration) -> Result<()>;
    async fn add_route(&self, route: &Route) -> Result<()>;
    async fn routes(&self, family: Family, table: Option<u32>) -> Result<Vec<Route>>;
    /// Writes a sysctl of this namespace. Only used on the host handle, whose
    /// namespace is the calling thread's.
    fn write_sysctl(&self, name: &str, value: &str) -> Result<()>;
}

impl Links for Netlink {
    async fn link_by_name(&self, name: &str) -> Result<Option<Link>> {
        Netlink::link_by_name(self, name).await
    }
    async fn require_link(&self, name: &str) -> Result<Link> {
        Netlink::require_link(self, name).await
    }
    async fn create_bridge(
        &self,
        name: &str,
        mtu: Option<u32>,
        vlan_filtering: bool,
    ) -> Result<()> {
        Netlink::create_bridge(self, name, mtu, vlan_filtering).await
    }
    async fn create_veth(&self, pair: &VethPair<'_>) -> Result<()> {
        Netlink::create_veth(self, pair).await
    }
    async fn delete_link_by_name(&self, name: &str) -> Result<bool> {
        Netlink::delete_link_by_name(self, name).await
    }
    async fn set_up(&self, index: u32) -> Result<()> {
        Netlink::set_up(self, index).await
    }
    async fn set_promisc(&self, index: u32, on: bool) -> Result<()> {
        Netlink::set_promisc(self, index, on).await
    }
    async fn set_mac(&self, index: u32, mac: MacAddr) -> Result<()> {
        Netlink::set_mac(self, index, mac).await
    }
    async fn set_port_hairpin(&self, index: u32, on: bool) -> Result<()> {
        Netlink::set_port_hairpin(self, index, on).await
    }
    async fn set_port_isolated(&self, index: u32, on: bool) -> Result<()> {
        Netlink::set_port_isolated(self, index, on).await
    }
    async fn set_port_flags(&self, index: u32, hairpin: bool, isolated: bool) -> Result<()> {
        Netlink::set_port_flags(self, index, hairpin, isolated).await
    }
    async fn port_vlans(&self, index: u32) -> Result<Vec<VlanEntry>> {
        Netlink::port_vlans(self, index).await
    }
    async fn add_port_vlan(&self, index: u32, vid: u16, pvid: bool, untagged: bool) -> Result<()> {
        Netlink::add_port_vlan(self, index, vid, pvid, untagged).await
    }
    async fn del_port_vlan(&self, index: u32, vid: u16) -> Result<()> {
        Netlink::del_port_vlan(self, index, vid).await
    }
    async fn wait_oper_up(&self, index: u32, delays: &[Duration]) -> Result<Link> {
        Netlink::wait_oper_up(self, index, delays).await
    }
    async fn addresses(&self, index: u32, family: Option<Family>) -> Result<Vec<Address>> {
        Netlink::addresses(self, index, family).await
    }
    async fn add_address(&self, index: u32, ip: IpNetwork) -> Result<()> {
        Netlink::add_address(self, index, ip).await
    }
    async fn del_address(&self, index: u32, ip: IpNetwork) -> Result<()> {
        Netlink::del_address(self, index, ip).await
    }
    async fn wait_addresses_settled(&self, index: u32, timeout: Duration) -> Result<()> {
        Netlink::wait_addresses_settled(self, index, timeout).await
    }
    async fn add_route(&self, route: &Route) -> Result<()> {
        Netlink::add_route(self, route).await
    }
    async fn routes(&self, family: Family, table: Option<u32>) -> Result<Vec<Route>> {
        Netlink::routes(self, family, table).await
    }
    fn write_sysctl(&self, name: &str, value: &str) -> Result<()> {
        cni_linux::sysctl::write(name, value)
    }
}

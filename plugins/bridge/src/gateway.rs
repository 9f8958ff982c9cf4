//! Gateway and default-route rules applied to the IPAM result (the reference's
//! `calcGateways`): interface indexes, computed gateways, default routes, and the
//! gateway addresses the bridge must carry.

use crate::config::BridgeConf;
use cni_protocol::{CniError, CniResult, Route};
use ipnetwork::IpNetwork;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Index of the container interface in the result (`[bridge, host veth, container]`).
pub const CONTAINER_IF_INDEX: usize = 2;

/// Gateway addresses (`gateway/<container prefix>`) to put on the bridge, per family.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gateways {
    /// IPv4 gateway addresses.
    pub v4: Vec<IpNetwork>,
    /// IPv6 gateway addresses.
    pub v6: Vec<IpNetwork>,
}

/// The first address of `net`'s subnet after the network address.
pub fn first_host(net: &IpNetwork) -> IpAddr {
    match net {
        IpNetwork::V4(n) => IpAddr::V4(Ipv4Addr::from(u32::from(n.network()).wrapping_add(1))),
        IpNetwork::V6(n) => IpAddr::V6(Ipv6Addr::from(u128::from(n.network()).wrapping_add(1))),
    }
}

fn default_dst(v4: bool) -> IpNetwork {
    if v4 {
        IpNetwork::new(Ipv4Addr::UNSPECIFIED.into(), 0).expect("valid")
    } else {
        IpNetwork::new(Ipv6Addr::UNSPECIFIED.into(), 0).expect("valid")
    }
}

/// Applies the rules to `result` in place and returns the bridge's gateway addresses.
/// An IPAM result whose gateway is not of its address's family is refused.
pub fn apply(result: &mut CniResult, conf: &BridgeConf) -> Result<Gateways, CniError> {
    let mut gateways = Gateways::default();
    let mut default_route_found = [false, false];
    for i in 0..result.ips.len() {
        let v4 = result.ips[i].address.is_ipv4();
        let family = usize::from(!v4);
        let ip = &mut result.ips[i];
        ip.interface = Some(CONTAINER_IF_INDEX);
        if ip.gateway.is_none() && conf.is_gateway {
            ip.gateway = Some(first_host(&ip.address));
        }
        let (address, gateway) = (ip.address, ip.gateway);
        if conf.is_default_gateway && !default_route_found[family] {
            let dst = default_dst(v4);
            let ipam_default = result.routes.iter().any(|r| r.gw.is_some() && r.dst == dst);
            if !ipam_default {
                result.routes.push(Route::new(dst, gateway));
            }
            default_route_found[family] = true;
        }
        if let (true, Some(gw)) = (conf.is_gateway, gateway) {
            let net = IpNetwork::new(gw, address.prefix())
                .ok()
                .filter(|_| gw.is_ipv4() == v4)
                .ok_or_else(|| {
                    // The gateway comes from the IPAM plugin's config.
                    CniError::invalid_config(format!(
                        "IPAM result: gateway {gw} is not of the family of address {address} (check the ipam config)"
                    ))
                })?;
            if v4 {
                gateways.v4.push(net)
            } else {
                gateways.v6.push(net)
            }
        }
    }
    Ok(gateways)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_protocol::IpConfig;

    fn conf(is_gateway: bool, is_default: bool) -> BridgeConf {
        BridgeConf {
            network: "n".into(),
            bridge: "cni0".into(),
            is_gateway: is_gateway || is_default,
            is_default_gateway: is_default,
            force_address: false,
            ip_masq: false,
            ip_masq_backend: None,
            mtu: 0,
            hairpin_mode: false,
            promisc_mode: false,
            vlan: 0,
            vlan_trunk: None,
            preserve_default_vlan: false,
            macspoofchk: false,
            port_security: false,
            enable_dad: false,
            accept_router_advertisements: false,
            disable_container_interface: false,
            port_isolation: false,
            pod_record_dir: None,
            pod: None,
            dns: None,
            mac: None,
            ipam_type: "host-local".into(),
        }
    }

    fn ip(addr: &str, gw: Option<&str>) -> IpConfig {
        IpConfig {
            address: addr.parse().unwrap(),
            gateway: gw.map(|g| g.parse().unwrap()),
            interface: None,
        }
    }

    #[test]
    fn default_gateway_adds_routes_per_family_in_order() {
        let mut r = CniResult {
            ips: vec![
                ip("10.77.0.2/24", Some("10.77.0.1")),
                ip("fd00:77::2/64", Some("fd00:77::1")),
            ],
            routes: vec![Route::new("192.168.0.0/16".parse().unwrap(), None)],
            ..CniResult::default()
        };
        let gws = apply(&mut r, &conf(false, true)).unwrap();
        let routes: Vec<String> = r
            .routes
            .iter()
            .map(|r| format!("{} {:?}", r.dst, r.gw))
            .collect();
        assert_eq!(
            routes,
            [
                "192.168.0.0/16 None",
                "0.0.0.0/0 Some(10.77.0.1)",
                "::/0 Some(fd00:77::1)"
            ]
        );
        assert!(r.ips.iter().all(|i| i.interface == Some(2)));
        assert_eq!(gws.v4, vec!["10.77.0.1/24".parse::<IpNetwork>().unwrap()]);
        assert_eq!(gws.v6, vec!["fd00:77::1/64".parse::<IpNetwork>().unwrap()]);
    }

    #[test]
    fn gateway_computed_when_missing() {
        let mut r = CniResult {
            ips: vec![ip("10.1.2.9/16", None)],
            ..CniResult::default()
        };
        let gws = apply(&mut r, &conf(true, false)).unwrap();
        assert_eq!(r.ips[0].gateway, Some("10.1.0.1".parse().unwrap()));
        assert_eq!(gws.v4[0].to_string(), "10.1.0.1/16");
        assert!(r.routes.is_empty());
    }

    #[test]
    fn ipam_default_route_with_gw_is_kept_alone() {
        let mut r = CniResult {
            ips: vec![ip("10.1.0.2/24", Some("10.1.0.1"))],
            routes: vec![Route::new(
                "0.0.0.0/0".parse().unwrap(),
                Some("10.1.0.254".parse().unwrap()),
            )],
            ..CniResult::default()
        };
        apply(&mut r, &conf(false, true)).unwrap();
        assert_eq!(r.routes.len(), 1);
    }

    #[test]
    fn no_gateway_mode_leaves_gateways_alone() {
        let mut r = CniResult {
            ips: vec![ip("10.1.0.2/24", None)],
            ..CniResult::default()
        };
        let gws = apply(&mut r, &conf(false, false)).unwrap();
        assert_eq!(r.ips[0].gateway, None);
        assert_eq!(gws, Gateways::default());
    }

    #[test]
    fn gateway_of_the_other_family_is_an_error_not_a_panic() {
        let mut r = CniResult {
            ips: vec![ip("fd00:77::2/64", Some("10.77.0.1"))],
            ..CniResult::default()
        };
        let err = apply(&mut r, &conf(true, false)).unwrap_err();
        assert_eq!(
            err.msg,
            "IPAM result: gateway 10.77.0.1 is not of the family of address fd00:77::2/64 (check the ipam config)"
        );
        assert_eq!(err.code, cni_protocol::ErrorCode::INVALID_NETWORK_CONFIG);
        let mut r = CniResult {
            ips: vec![ip("10.77.0.2/24", Some("fd00:77::1"))],
            ..CniResult::default()
        };
        assert!(apply(&mut r, &conf(false, true)).is_err());
    }
}

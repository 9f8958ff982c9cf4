//! The bridge plugin's configuration: every key of the reference bridge, its defaults
//! and validation, and the container MAC from runtimeConfig, args or `CNI_ARGS`.

use cni_linux::MacAddr;
use cni_protocol::{CniArgs, CniError, ErrorCode, Request};
use serde::Deserialize;

/// Every key the bridge reads, for Go-style case-insensitive matching.
const KNOWN_KEYS: &[&str] = &[
    "bridge",
    "isGateway",
    "isDefaultGateway",
    "forceAddress",
    "ipMasq",
    "ipMasqBackend",
    "mtu",
    "hairpinMode",
    "promiscMode",
    "vlan",
    "vlanTrunk",
    "minID",
    "maxID",
    "id",
    "preserveDefaultVlan",
    "macspoofchk",
    "portSecurity",
    "enabledad",
    "acceptRouterAdvertisements",
    "disableContainerInterface",
    "portIsolation",
    "dns",
    "nameservers",
    "domain",
    "search",
    "options",
    "args",
    "cni",
    "mac",
    "runtimeConfig",
];

/// The default bridge name.
pub const DEFAULT_BRIDGE: &str = "cni0";

#[derive(Debug, Default, Deserialize)]
struct RawConf {
    #[serde(default)]
    bridge: String,
    #[serde(rename = "isGateway", default)]
    is_gateway: bool,
    #[serde(rename = "isDefaultGateway", default)]
    is_default_gateway: bool,
    #[serde(rename = "forceAddress", default)]
    force_address: bool,
    #[serde(rename = "ipMasq", default)]
    ip_masq: bool,
    #[serde(rename = "ipMasqBackend", default)]
    ip_masq_backend: Option<String>,
    #[serde(default)]
    mtu: i64,
    #[serde(rename = "hairpinMode", default)]
    hairpin_mode: bool,
    #[serde(rename = "promiscMode", default)]
    promisc_mode: bool,
    #[serde(default)]
    vlan: i64,
    #[serde(rename = "vlanTrunk", default)]
    vlan_trunk: Option<Vec<Option<RawTrunk>>>,
    #[serde(rename = "preserveDefaultVlan", default)]
    preserve_default_vlan: bool,
    #[serde(default)]
    macspoofchk: bool,
    #[serde(rename = "portSecurity", default)]
    port_security: bool,
    #[serde(default)]
    enabledad: bool,
    #[serde(rename = "acceptRouterAdvertisements", default)]
    accept_router_advertisements: bool,
    #[serde(rename = "disableContainerInterface", default)]
    disable_container_interface: bool,
    #[serde(rename = "portIsolation", default)]
    port_isolation: bool,
    #[serde(default)]
    dns: Option<RawDns>,
    #[serde(default)]
    args: Option<RawArgs>,
    #[serde(rename = "runtimeConfig", default)]
    runtime_config: Option<RawMac>,
}

#[derive(Debug, Default, Deserialize)]
struct RawTrunk {
    #[serde(rename = "minID")]
    min_id: Option<i64>,
    #[serde(rename = "maxID")]
    max_id: Option<i64>,
    id: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
struct RawDns {
    nameservers: Option<Vec<String>>,
    #[serde(default)]
    domain: String,
    search: Option<Vec<String>>,
    options: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
struct RawArgs {
    cni: Option<RawMac>,
}

#[derive(Debug, Default, Deserialize)]
struct RawMac {
    #[serde(default)]
    mac: String,
}

/// The validated bridge configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeConf {
    /// Network name.
    pub network: String,
    /// Bridge link name.
    pub bridge: String,
    /// Put gateway addresses on the bridge (implied by `is_default_gateway`).
    pub is_gateway: bool,
    /// Add default routes via the gateway.
    pub is_default_gateway: bool,
    /// Replace a conflicting bridge address.
    pub force_address: bool,
    /// Masquerade container traffic leaving its subnet.
    pub ip_masq: bool,
    /// `ipMasqBackend`, parsed; `None` when absent.
    pub ip_masq_backend: Option<cni_firewall::Backend>,
    /// MTU for a new bridge and both veth ends; 0 = kernel default.
    pub mtu: u32,
    /// Hairpin on the host port.
    pub hairpin_mode: bool,
    /// Promiscuous bridge.
    pub promisc_mode: bool,
    /// Access VLAN (PVID, untagged); 0 = none.
    pub vlan: u16,
    /// Tagged VLANs, sorted and deduplicated; `None` when `vlanTrunk` is absent.
    pub vlan_trunk: Option<Vec<u16>>,
    /// Keep the kernel's default VLAN on the port.
    pub preserve_default_vlan: bool,
    /// Install the MAC spoof check.
    pub macspoofchk: bool,
    /// Let the pod send only as itself (its MAC, addresses and link-local address;
    /// no router advertisements, redirects or DHCP server replies).
    pub port_security: bool,
    /// Keep IPv6 DAD on in the container.
    pub enable_dad: bool,
    /// Let the container interface take IPv6 router advertisements (off by default
    /// when IPAM gives it its addresses: a neighbour's forged RA must not give it a
    /// route or an address).
    pub accept_router_advertisements: bool,
    /// Leave the container interface down.
    pub disable_container_interface: bool,
    /// Isolate the host port.
    pub port_isolation: bool,
    /// DNS override for the result, when any field is set.
    pub dns: Option<cni_protocol::Dns>,
    /// Container MAC requested by runtimeConfig, args or `CNI_ARGS`.
    pub mac: Option<MacAddr>,
    /// IPAM plugin type; empty means layer 2 only.
    pub ipam_type: String,
}

impl BridgeConf {
    /// Whether addresses come from IPAM (layer 3 mode).
    pub fn is_layer3(&self) -> bool {
        !self.ipam_type.is_empty()
    }

    /// Whether the port is configured with VLANs (so the default one may be removed).
    pub fn has_vlans(&self) -> bool {
        self.vlan != 0 || self.vlan_trunk.as_ref().is_some_and(|t| !t.is_empty())
    }

    /// Whether a bridge we create gets `vlan_filtering` (the key's presence counts).
    pub fn wants_vlan_filtering(&self) -> bool {
        self.vlan != 0 || self.vlan_trunk.is_some()
    }

    /// The masquerade backend: `ipMasqBackend` when set, else the reference's default
    /// (detected now, from the tools that work on this host).
    pub fn masq_backend(&self) -> cni_firewall::Backend {
        self.ip_masq_backend
            .unwrap_or_else(cni_firewall::Backend::detect)
    }

    /// Parses and validates the request's config and `CNI_ARGS`.
    pub fn load(req: &Request) -> Result<Self, CniError> {
        let raw: RawConf = req.config.decode(KNOWN_KEYS).map_err(|e| {
            CniError::new(
                ErrorCode::DECODING_FAILURE,
                format!("failed to load netconf: {e}"),
            )
        })?;
        let env_mac = CniArgs::parse(&req.args.args, &["MAC"])?
            .get("MAC")
            .map(str::to_string);
        Self::from_raw(raw, &req.config.name, &req.config.ipam_type, env_mac)
    }

    fn from_raw(
        raw: RawConf,
        network: &str,
        ipam_type: &str,
        env_mac: Option<String>,
    ) -> Result<Self, CniError> {
        if !(0..=4094).contains(&raw.vlan) {
            return Err(CniError::invalid_config(format!(
                "invalid VLAN ID {} (must be between 0 and 4094)",
                raw.vlan
            )));
        }
        let vlan_trunk = raw.vlan_trunk.as_deref().map(collect_trunk).transpose()?;
        let mtu = u32::try_from(raw.mtu).map_err(|_| {
            CniError::invalid_config(format!(
                "invalid MTU {} (mtu must be between 0 and {})",
                raw.mtu,
                u32::MAX
            ))
        })?;
        if raw.disable_container_interface && !ipam_type.is_empty() {
            return Err(CniError::invalid_config(
                "cannot use IPAM when DisableContainerInterface flag is set",
            ));
        }
        if raw.port_security && ipam_type.is_empty() {
            return Err(CniError::invalid_config(
                "portSecurity needs an ipam section: the pod may send only from the addresses IPAM gives it",
            ));
        }
        if raw.hairpin_mode && raw.promisc_mode {
            return Err(CniError::invalid_config(
                "cannot set hairpin mode and promiscuous mode at the same time",
            ));
        }
        let runtime_mac = raw.runtime_config.map(|m| m.mac).filter(|m| !m.is_empty());
        let args_mac = raw
            .args
            .and_then(|a| a.cni)
            .map(|m| m.mac)
            .filter(|m| !m.is_empty());
        let mac = runtime_mac
            .or(args_mac)
            .or(env_mac.filter(|m| !m.is_empty()))
            .map(|text| {
                text.parse::<MacAddr>()
                    .map_err(|e| CniError::invalid_config(format!("{e} (the pod's MAC)")))
            })
            .transpose()?;
        let dns = raw.dns.and_then(|d| {
            let set = d.nameservers.is_some()
                || d.search.is_some()
                || d.options.is_some()
                || !d.domain.is_empty();
            set.then(|| cni_protocol::Dns {
                nameservers: d.nameservers.unwrap_or_default(),
                domain: d.domain,
                search: d.search.unwrap_or_default(),
                options: d.options.unwrap_or_default(),
            })
        });
        let ip_masq_backend = raw
            .ip_masq_backend
            .as_deref()
            .map(str::parse::<cni_firewall::Backend>)
            .transpose()
            .map_err(|e| CniError::invalid_config(format!("{e} (ipMasqBackend)")))?;
        Ok(Self {
            network: network.to_string(),
            bridge: if raw.bridge.is_empty() {
                DEFAULT_BRIDGE.to_string()
            } else {
                raw.bridge
            },
            is_gateway: raw.is_gateway || raw.is_default_gateway,
            is_default_gateway: raw.is_default_gateway,
            force_address: raw.force_address,
            ip_masq: raw.ip_masq,
            ip_masq_backend,
            mtu,
            hairpin_mode: raw.hairpin_mode,
            promisc_mode: raw.promisc_mode,
            vlan: u16::try_from(raw.vlan).expect("checked range"),
            vlan_trunk,
            preserve_default_vlan: raw.preserve_default_vlan,
            macspoofchk: raw.macspoofchk,
            port_security: raw.port_security,
            enable_dad: raw.enabledad,
            accept_router_advertisements: raw.accept_router_advertisements,
            disable_container_interface: raw.disable_container_interface,
            port_isolation: raw.port_isolation,
            dns,
            mac,
            ipam_type: ipam_type.to_string(),
        })
    }
}

/// Merges trunk entries into a sorted, deduplicated VLAN list, with the reference's checks.
fn collect_trunk(entries: &[Option<RawTrunk>]) -> Result<Vec<u16>, CniError> {
    let valid = |n: i64| (1..=4094).contains(&n);
    let mut vlans = std::collections::BTreeSet::new();
    for entry in entries.iter().flatten() {
        match (entry.min_id, entry.max_id) {
            (Some(min), Some(max)) => {
                if !valid(min) {
                    return Err(CniError::invalid_config("incorrect trunk minID parameter"));
                }
                if !valid(max) {
                    return Err(CniError::invalid_config("incorrect trunk maxID parameter"));
                }
                if max < min {
                    return Err(CniError::invalid_config(
                        "minID is greater than maxID in trunk parameter",
                    ));
                }
                vlans.extend(min..=max);
            }
            (None, Some(_)) => {
                return Err(CniError::invalid_config(
                    "minID and maxID should be configured simultaneously, minID is missing",
                ));
            }
            (Some(_), None) => {
                return Err(CniError::invalid_config(
                    "minID and maxID should be configured simultaneously, maxID is missing",
                ));
            }
            (None, None) => {}
        }
        if let Some(id) = entry.id {
            if !valid(id) {
                return Err(CniError::invalid_config("incorrect trunk id parameter"));
            }
            vlans.insert(id);
        }
    }
    Ok(vlans
        .into_iter()
        .map(|v| u16::try_from(v).expect("checked range"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(json: &str, cni_args: &str) -> Result<BridgeConf, CniError> {
        let config = cni_protocol::NetConf::parse(json.as_bytes()).unwrap();
        let req = Request {
            args: cni_protocol::CmdArgs {
                command: cni_protocol::Command::Add,
                container_id: "c".into(),
                netns: String::new(),
                ifname: "eth0".into(),
                args: cni_args.into(),
                path: vec![],
                netns_override: false,
            },
            config,
            stdin: json.as_bytes().to_vec(),
        };
        BridgeConf::load(&req)
    }

    #[test]
    fn defaults() {
        let c = load(r#"{"name": "n", "type": "bridge"}"#, "").unwrap();
        assert_eq!(c.bridge, "cni0");
        assert!(!c.is_gateway && !c.is_layer3() && !c.wants_vlan_filtering());
        assert_eq!((c.mtu, c.vlan, c.mac, c.dns), (0, 0, None, None));
    }

    #[test]
    fn default_gateway_implies_gateway_and_keys_match_any_case() {
        let c = load(
            r#"{"name": "n", "IsDefaultGateway": true, "BRIDGE": "br9"}"#,
            "",
        )
        .unwrap();
        assert!(c.is_gateway && c.is_default_gateway);
        assert_eq!(c.bridge, "br9");
    }

    #[test]
    fn validation_messages() {
        let cases = [
            (
                r#""vlan": 4095"#,
                "invalid VLAN ID 4095 (must be between 0 and 4094)",
            ),
            (
                r#""vlan": -1"#,
                "invalid VLAN ID -1 (must be between 0 and 4094)",
            ),
            (
                r#""vlanTrunk": [{"minID": 0, "maxID": 5}]"#,
                "incorrect trunk minID parameter",
            ),
            (
                r#""vlanTrunk": [{"minID": 5, "maxID": 4095}]"#,
                "incorrect trunk maxID parameter",
            ),
            (
                r#""vlanTrunk": [{"minID": 6, "maxID": 5}]"#,
                "minID is greater than maxID in trunk parameter",
            ),
            (
                r#""vlanTrunk": [{"maxID": 5}]"#,
                "minID and maxID should be configured simultaneously, minID is missing",
            ),
            (
                r#""vlanTrunk": [{"minID": 5}]"#,
                "minID and maxID should be configured simultaneously, maxID is missing",
            ),
            (
                r#""vlanTrunk": [{"id": 0}]"#,
                "incorrect trunk id parameter",
            ),
            (
                r#""hairpinMode": true, "promiscMode": true"#,
                "cannot set hairpin mode and promiscuous mode at the same time",
            ),
            (
                r#""disableContainerInterface": true, "ipam": {"type": "host-local"}"#,
                "cannot use IPAM when DisableContainerInterface flag is set",
            ),
            (r#""ipMasqBackend": "pf""#, r#"unknown ipmasq backend "pf""#),
            (r#""runtimeConfig": {"mac": "zz"}"#, "zz"),
        ];
        for (keys, msg) in cases {
            let err = load(&format!(r#"{{"name": "n", {keys}}}"#), "").unwrap_err();
            assert!(err.msg.contains(msg), "{keys}: {}", err.msg);
            assert_eq!(
                err.code,
                ErrorCode::INVALID_NETWORK_CONFIG,
                "{keys}: {}",
                err.msg
            );
        }
        let err = load(r#"{"name": "n", "portIsolation": "true"}"#, "").unwrap_err();
        assert!(
            err.msg.starts_with("failed to load netconf: "),
            "{}",
            err.msg
        );
    }

    #[test]
    fn trunk_merged_sorted_deduplicated() {
        let c = load(
            r#"{"name": "n", "vlanTrunk": [{"id": 7}, {"minID": 3, "maxID": 5}, {"id": 4}]}"#,
            "",
        )
        .unwrap();
        assert_eq!(c.vlan_trunk, Some(vec![3, 4, 5, 7]));
        let empty = load(r#"{"name": "n", "vlanTrunk": []}"#, "").unwrap();
        assert!(empty.wants_vlan_filtering() && !empty.has_vlans());
    }

    #[test]
    fn mac_precedence() {
        let all = r#"{"name": "n", "runtimeConfig": {"mac": "02:00:00:00:00:01"}, "args": {"cni": {"mac": "02:00:00:00:00:02"}}}"#;
        assert_eq!(
            load(all, "MAC=02:00:00:00:00:03").unwrap().mac,
            Some(MacAddr([2, 0, 0, 0, 0, 1]))
        );
        let args = r#"{"name": "n", "args": {"cni": {"mac": "02:00:00:00:00:02"}}}"#;
        assert_eq!(
            load(args, "MAC=02:00:00:00:00:03").unwrap().mac,
            Some(MacAddr([2, 0, 0, 0, 0, 2]))
        );
        assert_eq!(
            load(r#"{"name": "n"}"#, "MAC=02:00:00:00:00:03")
                .unwrap()
                .mac,
            Some(MacAddr([2, 0, 0, 0, 0, 3]))
        );
        assert_eq!(
            load(r#"{"name": "n"}"#, "IP=1.2.3.4").unwrap_err().msg,
            r#"ARGS: unknown args ["IP=1.2.3.4"]"#
        );
    }

    #[test]
    fn dns_override_only_when_set() {
        let c = load(r#"{"name": "n", "dns": {"nameservers": []}}"#, "").unwrap();
        assert_eq!(c.dns, Some(cni_protocol::Dns::default()));
        assert_eq!(load(r#"{"name": "n", "dns": {}}"#, "").unwrap().dns, None);
    }
}

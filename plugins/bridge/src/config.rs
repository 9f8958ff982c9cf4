//! The bridge plugin's configuration: every key of the reference bridge, its defaults
//! and validation, and the container MAC from runtimeConfig, args or `CNI_ARGS`.

use cni_linux::MacAddr;
use cni_protocol::{CniArgs, CniError, Command, ErrorCode, Request};
use serde::Deserialize;
use std::path::PathBuf;

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
    "podRecordDir",
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
    #[serde(rename = "podRecordDir", default)]
    pod_record_dir: Option<String>,
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
    /// `podRecordDir` (ours): where ADD records which Kubernetes pod its addresses
    /// belong to, for the node agent; `None` when absent or empty.
    pub pod_record_dir: Option<PathBuf>,
    /// The pod (`namespace/name`) from `K8S_POD_NAMESPACE` and `K8S_POD_NAME` in
    /// `CNI_ARGS`: read only with `podRecordDir`, and only for ADD and CHECK (DEL and
    /// GC find records by container id and must not fail on arguments they never use).
    pub pod: Option<String>,
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
        let raw: RawConf = req
            .config
            .decode(KNOWN_KEYS)
            .map_err(|e| e.context("failed to load netconf"))?;
        // With podRecordDir the runtime's pod keys are ours to read (and so no longer
        // unknown); without it, CNI_ARGS is as strict as the reference's.
        let records = raw.pod_record_dir.as_deref().is_some_and(|d| !d.is_empty());
        let known: &[&str] = if records {
            &["MAC", K8S_NAMESPACE, K8S_NAME, K8S_UID, K8S_INFRA_ID]
        } else {
            &["MAC"]
        };
        let args = CniArgs::parse(&req.args.args, known)?;
        let env_mac = args.get("MAC").map(str::to_string);
        let mut conf = Self::from_raw(raw, &req.config.name, &req.config.ipam_type, env_mac)?;
        if records && matches!(req.args.command, Command::Add | Command::Check) {
            conf.pod = pod_of(&args)?;
        }
        Ok(conf)
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
        let pod_record_dir = raw
            .pod_record_dir
            .filter(|d| !d.is_empty())
            .map(|d| {
                let dir = PathBuf::from(&d);
                if dir.is_absolute() {
                    Ok(dir)
                } else {
                    Err(CniError::invalid_config(format!(
                        "podRecordDir must be an absolute path, not {d:?}"
                    )))
                }
            })
            .transpose()?;
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
            pod_record_dir,
            pod: None,
            dns,
            mac,
            ipam_type: ipam_type.to_string(),
        })
    }
}

const K8S_NAMESPACE: &str = "K8S_POD_NAMESPACE";
const K8S_NAME: &str = "K8S_POD_NAME";
const K8S_UID: &str = "K8S_POD_UID";
const K8S_INFRA_ID: &str = "K8S_POD_INFRA_CONTAINER_ID";

/// `namespace/name` of the pod `CNI_ARGS` names; `None` when it names none. A
/// namespace must be a DNS label and a name a DNS subdomain (RFC 1123), as
/// Kubernetes has them: anything else is no pod of Kubernetes, and would not fit a
/// pod record.
fn pod_of(args: &CniArgs) -> Result<Option<String>, CniError> {
    let invalid = |msg: String| CniError::new(ErrorCode::INVALID_ENVIRONMENT_VARIABLES, msg);
    let (namespace, name) = match (args.get(K8S_NAMESPACE), args.get(K8S_NAME)) {
        (None, None) => return Ok(None),
        (Some(namespace), Some(name)) => (namespace, name),
        (Some(_), None) => {
            return Err(invalid(format!(
                "CNI_ARGS has {K8S_NAMESPACE} but no {K8S_NAME} (podRecordDir needs both)"
            )));
        }
        (None, Some(_)) => {
            return Err(invalid(format!(
                "CNI_ARGS has {K8S_NAME} but no {K8S_NAMESPACE} (podRecordDir needs both)"
            )));
        }
    };
    if !is_dns_label(namespace) {
        return Err(invalid(format!(
            "invalid {K8S_NAMESPACE} {namespace:?} in CNI_ARGS: a namespace is a DNS label \
             (at most 63 lower-case letters, digits and '-', starting and ending with a \
             letter or digit)"
        )));
    }
    if name.len() > 253 || !name.split('.').all(is_dns_label) {
        return Err(invalid(format!(
            "invalid {K8S_NAME} {name:?} in CNI_ARGS: a pod name is a DNS subdomain (at \
             most 253 characters: DNS labels joined by '.')"
        )));
    }
    Ok(Some(format!("{namespace}/{name}")))
}

/// An RFC 1123 label: 1 to 63 of `a-z`, `0-9` and `-`, starting and ending with a
/// letter or digit.
fn is_dns_label(text: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = text.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes.first().copied().is_some_and(alnum)
        && bytes.last().copied().is_some_and(alnum)
        && bytes.iter().all(|&c| alnum(c) || c == b'-')
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
        load_for(Command::Add, json, cni_args)
    }

    fn load_for(command: Command, json: &str, cni_args: &str) -> Result<BridgeConf, CniError> {
        let config = cni_protocol::NetConf::parse(json.as_bytes()).unwrap();
        let req = Request {
            args: cni_protocol::CmdArgs {
                command,
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

    const RECORDS: &str = r#"{"name": "n", "podRecordDir": "/run/cni-plugins-rs/pods"}"#;
    const K8S: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-5d78c9869d-x2x8v;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=0f1e";

    #[test]
    fn pod_record_dir_and_the_pod_from_cni_args() {
        let c = load(RECORDS, K8S).unwrap();
        assert_eq!(
            c.pod_record_dir.as_deref(),
            Some(std::path::Path::new("/run/cni-plugins-rs/pods"))
        );
        assert_eq!(
            c.pod.as_deref(),
            Some("kube-system/coredns-5d78c9869d-x2x8v")
        );
        // The runtime's keys are known with podRecordDir, IgnoreUnknown or not.
        let strict =
            "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b.c;K8S_POD_UID=u;K8S_POD_INFRA_CONTAINER_ID=i";
        assert_eq!(load(RECORDS, strict).unwrap().pod.as_deref(), Some("a/b.c"));
        assert_eq!(
            load(r#"{"name": "n"}"#, strict).unwrap_err().msg,
            r#"ARGS: unknown args ["K8S_POD_NAMESPACE=a" "K8S_POD_NAME=b.c" "K8S_POD_UID=u" "K8S_POD_INFRA_CONTAINER_ID=i"]"#
        );
        // Without podRecordDir nothing is read; without the keys there is no pod.
        let plain = load(r#"{"name": "n"}"#, K8S).unwrap();
        assert_eq!((plain.pod_record_dir, plain.pod), (None, None));
        assert_eq!(load(RECORDS, "IgnoreUnknown=1").unwrap().pod, None);
        assert_eq!(load(RECORDS, "").unwrap().pod, None);
        let empty = load(r#"{"name": "n", "podRecordDir": ""}"#, K8S).unwrap();
        assert_eq!((empty.pod_record_dir, empty.pod), (None, None));
        // DEL, GC and STATUS do not read the pod: a bad name does not stop a cleanup.
        for command in [Command::Del, Command::Gc, Command::Status] {
            let c = load_for(command, RECORDS, "K8S_POD_NAMESPACE=BAD;K8S_POD_NAME=x").unwrap();
            assert!(c.pod_record_dir.is_some() && c.pod.is_none());
        }
        assert_eq!(
            load_for(Command::Check, RECORDS, K8S)
                .unwrap()
                .pod
                .as_deref(),
            Some("kube-system/coredns-5d78c9869d-x2x8v")
        );
    }

    #[test]
    fn pod_record_dir_and_pod_args_refused_with_the_key_named() {
        let err = load(r#"{"name": "n", "podRecordDir": "run/pods"}"#, K8S).unwrap_err();
        assert_eq!(err.code, ErrorCode::INVALID_NETWORK_CONFIG);
        assert_eq!(
            err.msg,
            r#"podRecordDir must be an absolute path, not "run/pods""#
        );
        let err = load(r#"{"name": "n", "podRecordDir": 5}"#, K8S).unwrap_err();
        assert_eq!(err.code, ErrorCode::DECODING_FAILURE);
        assert!(err.msg.contains("podRecordDir"), "{}", err.msg);
        let long_label = "a".repeat(64);
        let long_name = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(62),
        ]
        .join(".");
        let cases = [
            (
                "K8S_POD_NAMESPACE=Kube;K8S_POD_NAME=p",
                "invalid K8S_POD_NAMESPACE \"Kube\"",
            ),
            (
                "K8S_POD_NAMESPACE=a.b;K8S_POD_NAME=p",
                "invalid K8S_POD_NAMESPACE \"a.b\"",
            ),
            (
                "K8S_POD_NAMESPACE=-a;K8S_POD_NAME=p",
                "invalid K8S_POD_NAMESPACE \"-a\"",
            ),
            (
                &format!("K8S_POD_NAMESPACE={long_label};K8S_POD_NAME=p"),
                "invalid K8S_POD_NAMESPACE",
            ),
            (
                "K8S_POD_NAMESPACE=;K8S_POD_NAME=p",
                "invalid K8S_POD_NAMESPACE \"\"",
            ),
            (
                "K8S_POD_NAMESPACE=a;K8S_POD_NAME=",
                "invalid K8S_POD_NAME \"\"",
            ),
            (
                "K8S_POD_NAMESPACE=a;K8S_POD_NAME=a/b",
                "invalid K8S_POD_NAME \"a/b\"",
            ),
            (
                "K8S_POD_NAMESPACE=a;K8S_POD_NAME=a..b",
                "invalid K8S_POD_NAME \"a..b\"",
            ),
            (
                "K8S_POD_NAMESPACE=a;K8S_POD_NAME=p-",
                "invalid K8S_POD_NAME \"p-\"",
            ),
            (
                &format!("K8S_POD_NAMESPACE=a;K8S_POD_NAME={long_name}"),
                "invalid K8S_POD_NAME",
            ),
            (
                "K8S_POD_NAME=p",
                "CNI_ARGS has K8S_POD_NAME but no K8S_POD_NAMESPACE",
            ),
            (
                "K8S_POD_NAMESPACE=a",
                "CNI_ARGS has K8S_POD_NAMESPACE but no K8S_POD_NAME",
            ),
        ];
        for (args, msg) in cases {
            for command in [Command::Add, Command::Check] {
                let err = load_for(command, RECORDS, args).unwrap_err();
                assert_eq!(err.code, ErrorCode::INVALID_ENVIRONMENT_VARIABLES, "{args}");
                assert!(err.msg.starts_with(msg), "{args}: {}", err.msg);
            }
        }
        // The longest valid ones.
        let longest = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61),
        ]
        .join(".");
        assert_eq!(longest.len(), 253);
        let args = format!(
            "K8S_POD_NAMESPACE={long};K8S_POD_NAME={longest}",
            long = "a".repeat(63)
        );
        assert!(load(RECORDS, &args).unwrap().pod.is_some());
    }
}

//! The CNI result: one internal model (the 1.x shape) printed in each version's exact
//! shape, and parsers for all three shapes (prevResult, delegated IPAM results).

use crate::error::{CniError, ErrorCode};
use crate::json::{sort_keys, to_pretty};
use crate::version::ResultFamily;
use ipnetwork::IpNetwork;
use serde_json::{Map, Value, json};
use std::net::IpAddr;

/// An interface the plugin created or configured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Hardware address (`aa:bb:..`), empty when unknown.
    pub mac: String,
    /// MTU, 0 when not reported (1.1.0 field).
    pub mtu: u32,
    /// Netns path for container interfaces, empty for host interfaces.
    pub sandbox: String,
    /// vhost-user socket path (1.1.0 field).
    pub socket_path: String,
    /// PCI address of a device interface (1.1.0 field).
    pub pci_id: String,
}

/// An address assigned to an interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// Address with prefix length, host bits kept (`10.1.0.5/24`).
    pub address: IpNetwork,
    /// Default gateway of this subnet, if any.
    pub gateway: Option<IpAddr>,
    /// Index into the result's `interfaces`.
    pub interface: Option<usize>,
}

/// A route to install in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination.
    pub dst: IpNetwork,
    /// Next hop; when absent the plugin uses the family's gateway.
    pub gw: Option<IpAddr>,
    /// Route MTU, 0 = unset.
    pub mtu: u32,
    /// Advertised MSS, 0 = unset.
    pub advmss: u32,
    /// Metric, 0 = unset.
    pub priority: u32,
    /// Routing table.
    pub table: Option<i64>,
    /// Route scope.
    pub scope: Option<i64>,
}

impl Route {
    /// A route with only a destination and an optional gateway.
    pub fn new(dst: IpNetwork, gw: Option<IpAddr>) -> Self {
        Self {
            dst,
            gw,
            mtu: 0,
            advmss: 0,
            priority: 0,
            table: None,
            scope: None,
        }
    }
}

/// DNS settings for the container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dns {
    /// Name servers.
    pub nameservers: Vec<String>,
    /// Local domain.
    pub domain: String,
    /// Search domains.
    pub search: Vec<String>,
    /// resolver options.
    pub options: Vec<String>,
}

impl Dns {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_empty()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

/// A CNI ADD result, held in the 1.x model whatever version it came from or goes to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniResult {
    /// The version this result was produced or parsed as.
    pub cni_version: String,
    /// Interfaces.
    pub interfaces: Vec<Interface>,
    /// Addresses.
    pub ips: Vec<IpConfig>,
    /// Routes.
    pub routes: Vec<Route>,
    /// DNS settings.
    pub dns: Dns,
}

const NO_VALID_IPS: &str = "cannot convert: no valid IP addresses";

impl CniResult {
    /// Fails early, before any work, when this result could not be printed as `version`
    /// (a result without addresses has no 0.1.0/0.2.0 form).
    pub fn ensure_convertible(&self, version: &str) -> Result<(), CniError> {
        if ResultFamily::of(version)? == ResultFamily::V020 && self.ips.is_empty() {
            return Err(CniError::internal(NO_VALID_IPS));
        }
        Ok(())
    }

    /// The result JSON in `version`'s shape, laid out byte for byte like the reference.
    pub fn to_json(&self, version: &str) -> Result<String, CniError> {
        let value = match ResultFamily::of(version)? {
            ResultFamily::V020 => self.to_v020(version)?,
            ResultFamily::V040 => self.to_v040(version),
            // The reference v1.1.1 (the newest to speak 1.0.0 only) prints 1.0.0 in struct
            // order with `dns` always; references that speak 1.1.0 print through a generic
            // map, so keys come out sorted and an empty `dns` is left out.
            ResultFamily::V100 if version == "1.0.0" => self.to_v100(version, true),
            ResultFamily::V100 => sort_keys(self.to_v100(version, false)),
        };
        Ok(to_pretty(&value))
    }

    fn to_v100(&self, version: &str, with_empty_dns: bool) -> Value {
        let mut obj = Map::new();
        obj.insert("cniVersion".into(), version.into());
        if !self.interfaces.is_empty() {
            obj.insert(
                "interfaces".into(),
                self.interfaces.iter().map(interface_v100).collect(),
            );
        }
        if !self.ips.is_empty() {
            obj.insert(
                "ips".into(),
                self.ips.iter().map(|ip| ip_json(ip, false)).collect(),
            );
        }
        insert_routes(&mut obj, &self.routes);
        if with_empty_dns || !self.dns.is_empty() {
            obj.insert("dns".into(), dns_json(&self.dns));
        }
        Value::Object(obj)
    }

    fn to_v040(&self, version: &str) -> Value {
        let mut obj = Map::new();
        obj.insert("cniVersion".into(), version.into());
        if !self.interfaces.is_empty() {
            let list = self.interfaces.iter().map(|i| {
                let mut o = Map::new();
                o.insert("name".into(), i.name.clone().into());
                insert_nonempty(&mut o, "mac", &i.mac);
                insert_nonempty(&mut o, "sandbox", &i.sandbox);
                Value::Object(o)
            });
            obj.insert("interfaces".into(), list.collect());
        }
        if !self.ips.is_empty() {
            obj.insert(
                "ips".into(),
                self.ips.iter().map(|ip| ip_json(ip, true)).collect(),
            );
        }
        insert_routes(&mut obj, &self.routes);
        obj.insert("dns".into(), dns_json(&self.dns));
        Value::Object(obj)
    }

    fn to_v020(&self, version: &str) -> Result<Value, CniError> {
        let first = |v4: bool| self.ips.iter().find(|ip| ip.address.is_ipv4() == v4);
        let (ip4, ip6) = (first(true), first(false));
        if ip4.is_none() && ip6.is_none() {
            return Err(CniError::internal(NO_VALID_IPS));
        }
        let family = |ip: &IpConfig| {
            let mut o = Map::new();
            o.insert("ip".into(), ip.address.to_string().into());
            if let Some(gw) = ip.gateway {
                o.insert("gateway".into(), gw.to_string().into());
            }
            let routes: Vec<Value> = self
                .routes
                .iter()
                .filter(|r| r.dst.is_ipv4() == ip.address.is_ipv4())
                .map(|r| route_json(&Route::new(r.dst, r.gw)))
                .collect();
            if !routes.is_empty() {
                o.insert("routes".into(), routes.into());
            }
            Value::Object(o)
        };
        let mut obj = Map::new();
        obj.insert("cniVersion".into(), version.into());
        if let Some(ip) = ip4 {
            obj.insert("ip4".into(), family(ip));
        }
        if let Some(ip) = ip6 {
            obj.insert("ip6".into(), family(ip));
        }
        obj.insert("dns".into(), dns_json(&self.dns));
        Ok(Value::Object(obj))
    }

    /// Parses a result of any version. The version is the result's own `cniVersion`, or
    /// `default_version` (the config's) when it has none, as the reference does.
    pub fn parse(value: &Value, default_version: &str) -> Result<Self, CniError> {
        // Code 999 whatever the member, as the reference reports a result it cannot read.
        let bad = |e: CniError| CniError::internal(format!("failed to parse result: {}", e.msg));
        let obj = value
            .as_object()
            .ok_or_else(|| bad(undecodable("not a JSON object".into())))?;
        let version = match obj.get("cniVersion").and_then(Value::as_str) {
            Some(v) if !v.is_empty() => v.to_string(),
            _ => default_version.to_string(),
        };
        let mut result = Self {
            cni_version: version.clone(),
            ..Self::default()
        };
        result.dns = parse_dns(obj.get("dns")).map_err(bad)?;
        match ResultFamily::of(&version)? {
            ResultFamily::V020 => {
                for key in ["ip4", "ip6"] {
                    if let Some(family) = obj.get(key).filter(|v| !v.is_null()) {
                        let address = parse_net(family.get("ip"), "ip").map_err(bad)?;
                        let gateway =
                            parse_opt_ip(family.get("gateway"), "gateway").map_err(bad)?;
                        result.ips.push(IpConfig {
                            address,
                            gateway,
                            interface: None,
                        });
                        for r in as_list(family.get("routes"), "routes").map_err(bad)? {
                            result.routes.push(parse_route(r).map_err(bad)?);
                        }
                    }
                }
            }
            ResultFamily::V040 | ResultFamily::V100 => {
                for i in as_list(obj.get("interfaces"), "interfaces").map_err(bad)? {
                    result.interfaces.push(parse_interface(i).map_err(bad)?);
                }
                for ip in as_list(obj.get("ips"), "ips").map_err(bad)? {
                    let interface = match ip.get("interface") {
                        None | Some(Value::Null) => None,
                        Some(v) => Some(
                            v.as_u64()
                                .and_then(|n| usize::try_from(n).ok())
                                .ok_or_else(|| {
                                    bad(undecodable(format!("invalid interface index {v}")))
                                })?,
                        ),
                    };
                    result.ips.push(IpConfig {
                        address: parse_net(ip.get("address"), "address").map_err(bad)?,
                        gateway: parse_opt_ip(ip.get("gateway"), "gateway").map_err(bad)?,
                        interface,
                    });
                }
                for r in as_list(obj.get("routes"), "routes").map_err(bad)? {
                    result.routes.push(parse_route(r).map_err(bad)?);
                }
            }
        }
        Ok(result)
    }
}

fn insert_nonempty(obj: &mut Map<String, Value>, key: &str, text: &str) {
    if !text.is_empty() {
        obj.insert(key.into(), text.into());
    }
}

fn insert_routes(obj: &mut Map<String, Value>, routes: &[Route]) {
    if !routes.is_empty() {
        obj.insert("routes".into(), routes.iter().map(route_json).collect());
    }
}

fn interface_v100(i: &Interface) -> Value {
    let mut o = Map::new();
    o.insert("name".into(), i.name.clone().into());
    insert_nonempty(&mut o, "mac", &i.mac);
    if i.mtu != 0 {
        o.insert("mtu".into(), i.mtu.into());
    }
    insert_nonempty(&mut o, "sandbox", &i.sandbox);
    insert_nonempty(&mut o, "socketPath", &i.socket_path);
    insert_nonempty(&mut o, "pciID", &i.pci_id);
    Value::Object(o)
}

fn ip_json(ip: &IpConfig, with_version: bool) -> Value {
    let mut o = Map::new();
    if with_version {
        o.insert(
            "version".into(),
            if ip.address.is_ipv4() { "4" } else { "6" }.into(),
        );
    }
    if let Some(index) = ip.interface {
        o.insert("interface".into(), index.into());
    }
    o.insert("address".into(), ip.address.to_string().into());
    if let Some(gw) = ip.gateway {
        o.insert("gateway".into(), gw.to_string().into());
    }
    Value::Object(o)
}

fn route_json(r: &Route) -> Value {
    let mut o = Map::new();
    o.insert("dst".into(), r.dst.to_string().into());
    if let Some(gw) = r.gw {
        o.insert("gw".into(), gw.to_string().into());
    }
    for (key, n) in [
        ("mtu", r.mtu),
        ("advmss", r.advmss),
        ("priority", r.priority),
    ] {
        if n != 0 {
            o.insert(key.into(), n.into());
        }
    }
    if let Some(table) = r.table {
        o.insert("table".into(), table.into());
    }
    if let Some(scope) = r.scope {
        o.insert("scope".into(), scope.into());
    }
    Value::Object(o)
}

fn dns_json(d: &Dns) -> Value {
    let mut o = Map::new();
    if !d.nameservers.is_empty() {
        o.insert("nameservers".into(), json!(d.nameservers));
    }
    insert_nonempty(&mut o, "domain", &d.domain);
    if !d.search.is_empty() {
        o.insert("search".into(), json!(d.search));
    }
    if !d.options.is_empty() {
        o.insert("options".into(), json!(d.options));
    }
    Value::Object(o)
}

/// A member of a result (or of a route or DNS object) of the wrong type or value: code 6,
/// the member named; [`CniResult::parse`] and the plugins put their own prefix before it.
fn undecodable(msg: String) -> CniError {
    CniError::new(ErrorCode::DECODING_FAILURE, msg)
}

fn as_list<'a>(value: Option<&'a Value>, key: &str) -> Result<&'a [Value], CniError> {
    match value {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(undecodable(format!("{key} must be a list, got {other}"))),
    }
}

fn as_text<'a>(value: Option<&'a Value>, key: &str) -> Result<&'a str, CniError> {
    match value {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(undecodable(format!("{key} must be a string, got {other}"))),
    }
}

fn parse_net(value: Option<&Value>, key: &str) -> Result<IpNetwork, CniError> {
    let text = as_text(value, key)?;
    crate::ip::parse_cidr(text).ok_or_else(|| undecodable(format!("invalid {key} {text:?}")))
}

fn parse_opt_ip(value: Option<&Value>, key: &str) -> Result<Option<IpAddr>, CniError> {
    let text = as_text(value, key)?;
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|_| undecodable(format!("invalid {key} {text:?}")))
}

fn parse_opt_int(value: Option<&Value>, key: &str) -> Result<Option<i64>, CniError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| undecodable(format!("invalid {key} {v}"))),
    }
}

fn parse_uint(value: Option<&Value>, key: &str) -> Result<u32, CniError> {
    Ok(parse_opt_int(value, key)?.map_or(0, |n| u32::try_from(n).unwrap_or(0)))
}

/// Parses one route object (`dst`, `gw`, `mtu`, `advmss`, `priority`, `table`, `scope`).
pub fn parse_route(r: &Value) -> Result<Route, CniError> {
    Ok(Route {
        dst: parse_net(r.get("dst"), "dst")?,
        gw: parse_opt_ip(r.get("gw"), "gw")?,
        mtu: parse_uint(r.get("mtu"), "mtu")?,
        advmss: parse_uint(r.get("advmss"), "advmss")?,
        priority: parse_uint(r.get("priority"), "priority")?,
        table: parse_opt_int(r.get("table"), "table")?,
        scope: parse_opt_int(r.get("scope"), "scope")?,
    })
}

fn parse_interface(i: &Value) -> Result<Interface, CniError> {
    Ok(Interface {
        name: as_text(i.get("name"), "name")?.to_string(),
        mac: as_text(i.get("mac"), "mac")?.to_string(),
        mtu: parse_uint(i.get("mtu"), "mtu")?,
        sandbox: as_text(i.get("sandbox"), "sandbox")?.to_string(),
        socket_path: as_text(i.get("socketPath"), "socketPath")?.to_string(),
        pci_id: as_text(i.get("pciID"), "pciID")?.to_string(),
    })
}

fn string_list(value: Option<&Value>, key: &str) -> Result<Vec<String>, CniError> {
    as_list(value, key)?
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| undecodable(format!("{key} must hold strings")))
        })
        .collect()
}

/// Parses a DNS object; absent or null is empty.
pub fn parse_dns(value: Option<&Value>) -> Result<Dns, CniError> {
    let Some(d) = value.filter(|v| !v.is_null()) else {
        return Ok(Dns::default());
    };
    Ok(Dns {
        nameservers: string_list(d.get("nameservers"), "nameservers")?,
        domain: as_text(d.get("domain"), "domain")?.to_string(),
        search: string_list(d.get("search"), "search")?,
        options: string_list(d.get("options"), "options")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNetwork {
        s.parse().unwrap()
    }

    /// A dual-stack host-local result as the reference plugin prints it.
    fn host_local_result() -> CniResult {
        CniResult {
            cni_version: "1.1.0".into(),
            interfaces: vec![],
            ips: vec![
                IpConfig {
                    address: net("10.9.0.2/24"),
                    gateway: Some("10.9.0.1".parse().unwrap()),
                    interface: None,
                },
                IpConfig {
                    address: net("fd00:9::2/64"),
                    gateway: Some("fd00:9::1".parse().unwrap()),
                    interface: None,
                },
            ],
            routes: vec![
                Route::new(net("0.0.0.0/0"), None),
                Route::new(net("fd00:1::/64"), Some("fd00:9::fe".parse().unwrap())),
            ],
            dns: Dns::default(),
        }
    }

    const HOST_LOCAL_020: &str = r#"{
    "cniVersion": "0.1.0",
    "ip4": {
        "ip": "10.9.0.2/24",
        "gateway": "10.9.0.1",
        "routes": [
            {
                "dst": "0.0.0.0/0"
            }
        ]
    },
    "ip6": {
        "ip": "fd00:9::2/64",
        "gateway": "fd00:9::1",
        "routes": [
            {
                "dst": "fd00:1::/64",
                "gw": "fd00:9::fe"
            }
        ]
    },
    "dns": {}
}"#;

    const HOST_LOCAL_040: &str = r#"{
    "cniVersion": "0.4.0",
    "ips": [
        {
            "version": "4",
            "address": "10.9.0.2/24",
            "gateway": "10.9.0.1"
        },
        {
            "version": "6",
            "address": "fd00:9::2/64",
            "gateway": "fd00:9::1"
        }
    ],
    "routes": [
        {
            "dst": "0.0.0.0/0"
        },
        {
            "dst": "fd00:1::/64",
            "gw": "fd00:9::fe"
        }
    ],
    "dns": {}
}"#;

    #[test]
    fn host_local_shapes_byte_exact() {
        let r = host_local_result();
        assert_eq!(r.to_json("0.1.0").unwrap(), HOST_LOCAL_020);
        assert_eq!(
            r.to_json("0.2.0").unwrap(),
            HOST_LOCAL_020.replace("0.1.0", "0.2.0")
        );
        assert_eq!(r.to_json("0.4.0").unwrap(), HOST_LOCAL_040);
        for v in ["0.3.0", "0.3.1"] {
            assert_eq!(r.to_json(v).unwrap(), HOST_LOCAL_040.replace("0.4.0", v));
        }
        let v100 = HOST_LOCAL_040
            .replace("0.4.0", "1.0.0")
            .replace("            \"version\": \"4\",\n", "")
            .replace("            \"version\": \"6\",\n", "");
        assert_eq!(r.to_json("1.0.0").unwrap(), v100);
        let v110 = v100
            .replace("1.0.0", "1.1.0")
            .replace(",\n    \"dns\": {}", "");
        assert_eq!(r.to_json("1.1.0").unwrap(), v110);
    }

    const BRIDGE_110: &str = r#"{
    "cniVersion": "1.1.0",
    "dns": {
        "nameservers": [
            "10.77.0.1"
        ]
    },
    "interfaces": [
        {
            "mac": "02:df:07:e3:36:18",
            "name": "cnirefbr0"
        },
        {
            "mac": "72:ab:ff:6f:0d:8c",
            "name": "veth1855a9b1"
        },
        {
            "mac": "8a:1f:72:44:af:89",
            "name": "eth0",
            "sandbox": "/var/run/netns/cnirefc"
        }
    ],
    "ips": [
        {
            "address": "10.77.0.2/24",
            "gateway": "10.77.0.1",
            "interface": 2
        },
        {
            "address": "fd00:77::2/64",
            "gateway": "fd00:77::1",
            "interface": 2
        }
    ],
    "routes": [
        {
            "dst": "192.168.0.0/16"
        },
        {
            "dst": "0.0.0.0/0",
            "gw": "10.77.0.1"
        },
        {
            "dst": "::/0",
            "gw": "fd00:77::1"
        }
    ]
}"#;

    #[test]
    fn bridge_result_round_trips_byte_exact() {
        let parsed = CniResult::parse(&serde_json::from_str(BRIDGE_110).unwrap(), "1.1.0").unwrap();
        assert_eq!(parsed.interfaces.len(), 3);
        assert_eq!(parsed.ips[1].interface, Some(2));
        assert_eq!(parsed.to_json("1.1.0").unwrap(), BRIDGE_110);
        let v020 = parsed.to_json("0.2.0").unwrap();
        let v: Value = serde_json::from_str(&v020).unwrap();
        assert_eq!(v["ip4"]["routes"].as_array().unwrap().len(), 2);
        assert_eq!(v["ip6"]["routes"][0]["dst"], "::/0");
        assert!(v.get("interfaces").is_none());
    }

    #[test]
    fn parses_every_family_back_to_the_same_model() {
        let r = host_local_result();
        for v in [
            "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
        ] {
            let text = r.to_json(v).unwrap();
            let back = CniResult::parse(&serde_json::from_str(&text).unwrap(), "9.9.9").unwrap();
            assert_eq!(back.cni_version, v);
            assert_eq!(back.ips, r.ips, "{v}");
            assert_eq!(back.routes, r.routes, "{v}");
        }
    }

    #[test]
    fn missing_version_defaults_to_config_version() {
        let v: Value = serde_json::json!({"ip4": {"ip": "10.0.0.2/24"}});
        assert_eq!(CniResult::parse(&v, "0.2.0").unwrap().ips.len(), 1);
    }

    #[test]
    fn no_ips_cannot_become_020() {
        let r = CniResult {
            interfaces: vec![Interface {
                name: "eth0".into(),
                ..Interface::default()
            }],
            ..CniResult::default()
        };
        assert_eq!(
            r.to_json("0.2.0").unwrap_err().msg,
            "cannot convert: no valid IP addresses"
        );
        assert!(r.ensure_convertible("0.1.0").is_err());
        assert!(r.ensure_convertible("0.3.1").is_ok());
        assert!(r.to_json("0.3.1").unwrap().contains("\"dns\": {}"));
    }

    #[test]
    fn extra_route_fields_kept_and_sorted_in_1x() {
        let mut r = host_local_result();
        r.routes = vec![Route {
            mtu: 1400,
            table: Some(100),
            scope: Some(0),
            priority: 5,
            ..Route::new(net("10.1.0.0/16"), None)
        }];
        let text = r.to_json("1.1.0").unwrap();
        let keys: Vec<&str> = [
            "\"dst\"",
            "\"mtu\"",
            "\"priority\"",
            "\"scope\"",
            "\"table\"",
        ]
        .to_vec();
        let positions: Vec<usize> = keys.iter().map(|k| text.find(k).unwrap()).collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{text}");
        let v040 = r.to_json("0.4.0").unwrap();
        assert!(v040.find("\"mtu\"").unwrap() < v040.find("\"priority\"").unwrap());
        assert!(v040.find("\"table\"").unwrap() < v040.find("\"scope\"").unwrap());
    }

    #[test]
    fn rejects_malformed_results() {
        for bad in [
            serde_json::json!("x"),
            serde_json::json!({"cniVersion": "1.0.0", "ips": [{"address": "nope"}]}),
            serde_json::json!({"cniVersion": "1.0.0", "ips": {}}),
            serde_json::json!({"cniVersion": "0.5.0"}),
        ] {
            assert!(CniResult::parse(&bad, "1.0.0").is_err(), "{bad}");
        }
    }
}

//! Reading kernel state inside a test namespace: links, addresses, routes, sysctls.
//!
//! Everything goes through `ip -j` (stable JSON) or `cat /proc/sys/...` run with
//! `ip netns exec`, so the harness needs no netlink code of its own and cannot share a
//! bug with the plugins' netlink layer.

use serde_json::Value;

use crate::netns::Netns;

/// `ip -j <args>` inside `ns`, parsed. Panics if `ip` fails; empty output (some `ip`
/// versions print nothing for an empty list) reads as `[]`.
pub fn ip_json(ns: &Netns, args: &[&str]) -> Value {
    let mut argv = vec!["ip", "-j"];
    argv.extend_from_slice(args);
    let text = ns.exec_ok(&argv);
    if text.trim().is_empty() {
        return Value::Array(Vec::new());
    }
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "in netns {}: {argv:?} printed no JSON ({e}): {text}",
            ns.name()
        )
    })
}

/// `ip -j link show`: every link in the namespace.
pub fn links(ns: &Netns) -> Value {
    ip_json(ns, &["link", "show"])
}

/// `ip -j link show dev <dev>`'s single entry, or `None` if there is no such link.
pub fn link(ns: &Netns, dev: &str) -> Option<Value> {
    let out = ns.exec(&["ip", "-j", "link", "show", "dev", dev]);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("does not exist"),
            "in netns {}: ip link show dev {dev} failed: {stderr}",
            ns.name()
        );
        return None;
    }
    let parsed: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("ip -j link show dev {dev}: bad JSON: {e}"));
    parsed.as_array().and_then(|a| a.first()).cloned()
}

/// The `flags` of link `dev` (e.g. `["LOOPBACK","UP","LOWER_UP"]`). Panics if the link
/// does not exist.
pub fn link_flags(ns: &Netns, dev: &str) -> Vec<String> {
    let link = link(ns, dev).unwrap_or_else(|| panic!("no link {dev} in netns {}", ns.name()));
    link["flags"]
        .as_array()
        .map(|flags| {
            flags
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether link `dev` is administratively up (`UP` among its flags).
pub fn link_is_up(ns: &Netns, dev: &str) -> bool {
    link_flags(ns, dev).iter().any(|f| f == "UP")
}

/// `ip -j addr show dev <dev>`.
pub fn addrs(ns: &Netns, dev: &str) -> Value {
    ip_json(ns, &["addr", "show", "dev", dev])
}

/// The addresses of `dev` as `address/prefixlen` strings, in kernel order.
pub fn addr_cidrs(ns: &Netns, dev: &str) -> Vec<String> {
    addrs(ns, dev)
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|link| link["addr_info"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| {
            Some(format!(
                "{}/{}",
                a["local"].as_str()?,
                a["prefixlen"].as_u64()?
            ))
        })
        .collect()
}

/// `ip -j route show` (IPv4 main table).
pub fn routes(ns: &Netns) -> Value {
    ip_json(ns, &["route", "show"])
}

/// `ip -j -6 route show` (IPv6 main table).
pub fn routes6(ns: &Netns) -> Value {
    ip_json(ns, &["-6", "route", "show"])
}

/// A sysctl's value inside `ns`, trimmed. `key` is a path below `/proc/sys`, either with
/// slashes (`net/ipv4/ip_forward`, required when a name holds a dot such as `eth0.100`) or
/// in dotted form (`net.ipv4.ip_forward`).
pub fn sysctl(ns: &Netns, key: &str) -> String {
    let rel = if key.contains('/') {
        key.to_owned()
    } else {
        key.replace('.', "/")
    };
    ns.exec_ok(&["cat", &format!("/proc/sys/{rel}")])
        .trim()
        .to_owned()
}

/// The nat tables of iptables and ip6tables and the nft rule set of `ns`, as text,
/// without the save tools' comment lines (which carry timestamps), so that two states
/// compare.
pub fn nat_and_nft(ns: &Netns) -> String {
    let mut text = String::new();
    for argv in [
        &["iptables-save", "-t", "nat"][..],
        &["ip6tables-save", "-t", "nat"][..],
        &["nft", "list", "ruleset"][..],
    ] {
        text.push_str(&String::from_utf8_lossy(&ns.exec(argv).stdout));
    }
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Whether the run requires WireGuard and what it needs of the kernel beside it
/// (`CNI_RS_REQUIRE_WIREGUARD=1`, set by the stock-kernel VM): there a missing piece is a
/// failure, not a skip.
pub fn wireguard_required() -> bool {
    std::env::var("CNI_RS_REQUIRE_WIREGUARD").as_deref() == Ok("1")
}

/// Whether the kernel makes WireGuard links, tried in a throwaway namespace, which is
/// returned (a caller may keep it to the test's end: a namespace's deletion is torn
/// down in the background, and one deleted at once can slow what the test times next).
/// A kernel that does not is a skip (`None`, said on stderr), or a failure under
/// `CNI_RS_REQUIRE_WIREGUARD=1` (the stock-kernel VM sets it).
pub fn wireguard_probe(test: &str) -> Option<Netns> {
    let probe = Netns::new("cnibb-wg-probe");
    let out = probe.exec(&["ip", "link", "add", "wg-probe", "type", "wireguard"]);
    if out.status.success() {
        return Some(probe);
    }
    let why = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    assert!(
        !wireguard_required(),
        "{test}: CNI_RS_REQUIRE_WIREGUARD=1 but this kernel makes no WireGuard link: {why}"
    );
    eprintln!("skipping {test}: this kernel makes no WireGuard link ({why})");
    None
}

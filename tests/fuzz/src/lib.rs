//! The fuzz targets' bodies, one function per target, each taking AFL++'s input as
//! bytes. The binaries in `fuzz_targets/` only hand inputs to these, so a target is
//! written once whichever fuzzer drives it, and a crashing input can be replayed
//! through the same function from a test.
//!
//! A target fails by panicking: every parser must turn any input into a value or an
//! error, and the assertions here state what an accepted input must satisfy.

use std::collections::HashSet;
use std::path::Path;

use cni_bridge::config::BridgeConf;
use cni_host_local::config::IpamConfig;
use cni_host_local::range::to_u128;
use cni_linux::netlink::{Reply, decode_reply};
use cni_netlink::wire::{NLMSG_ERROR, NLMSG_HDRLEN};
use cni_netlink::{attrs, messages};
use cni_protocol::{
    CmdArgs, CniArgs, CniError, CniResult, Command, NetConf, Plugin, Request, SUPPORTED_VERSIONS,
    dispatch,
};
use cnitool::cache::{Entry, cached_result, file_path, listed_entry};

/// A target's body: panics on a finding.
pub type Target = fn(&[u8]);

/// Every target, by the name of its binary and seed directory.
pub const TARGETS: [(&str, Target); 7] = [
    ("netconf", netconf),
    ("result", result),
    ("host_local", host_local),
    ("bridge_config", bridge_config),
    ("netlink", netlink),
    ("nftables", nftables),
    ("cnitool_cache", cnitool_cache),
];

/// The first line (lossily as text) and the rest: `CNI_ARGS` and a config.
fn args_and_config(data: &[u8]) -> (String, &[u8]) {
    match data.iter().position(|b| *b == b'\n') {
        Some(i) => (
            String::from_utf8_lossy(&data[..i]).into_owned(),
            &data[i + 1..],
        ),
        None => (String::new(), data),
    }
}

/// A plugin that answers ADD with the prevResult (so printing is fuzzed too) and reads
/// the GC list on DEL.
struct Echo;

impl Plugin for Echo {
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        Ok(req.config.prev_result.clone().unwrap_or_default())
    }
    fn del(&self, req: &Request) -> Result<(), CniError> {
        req.config.valid_attachments().map(|_| ())
    }
    fn check(&self, _req: &Request) -> Result<(), CniError> {
        Ok(())
    }
}

const COMMANDS: [&str; 7] = ["ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION", "BOGUS"];

/// Network config bytes, `CNI_ARGS` and the whole dispatcher: the first byte picks the
/// command, the next line is `CNI_ARGS`, the rest is stdin. Nothing may panic; every
/// failure is one complete error JSON.
pub fn netconf(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let (args, stdin) = args_and_config(rest);
    let _ = CniArgs::parse(&args, &["IP", "MAC"]);
    if let Ok(mut conf) = NetConf::parse(stdin) {
        let _ = conf.load_prev_result();
        let _ = conf.valid_attachments();
    }
    let command = COMMANDS[usize::from(first) % COMMANDS.len()];
    let env = |k: &str| -> Option<String> {
        match k {
            "CNI_COMMAND" => Some(command.into()),
            "CNI_CONTAINERID" => Some("ctr".into()),
            "CNI_NETNS" => Some("/nonexistent/netns".into()),
            "CNI_IFNAME" => Some("eth0".into()),
            "CNI_PATH" => Some("/nonexistent".into()),
            "CNI_ARGS" => Some(args.clone()),
            _ => None,
        }
    };
    let outcome = dispatch(&Echo, "CNI fuzz plugin", &env, &mut &stdin[..]);
    if outcome.exit_code != 0 {
        let value: serde_json::Value =
            serde_json::from_str(&outcome.stdout).expect("error output is JSON");
        assert!(
            value["code"].is_u64() && value["msg"].is_string(),
            "{value}"
        );
    }
}

/// Results of any shape (prevResult, delegated IPAM output): parse in every default
/// version, print in every supported version exactly when convertible, and the print
/// parses back.
pub fn result(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    for default in SUPPORTED_VERSIONS.iter().chain(&["", "0.5.0"]) {
        let Ok(result) = CniResult::parse(&value, default) else {
            continue;
        };
        for v in SUPPORTED_VERSIONS {
            let printed = result.to_json(v);
            assert_eq!(printed.is_ok(), result.ensure_convertible(v).is_ok());
            if let Ok(text) = printed {
                let back: serde_json::Value = serde_json::from_str(&text).expect("JSON");
                CniResult::parse(&back, v).expect("a printed result parses");
            }
        }
    }
}

/// host-local: the IPAM config loader (first line `CNI_ARGS`, the rest the config) and,
/// when it accepts, range arithmetic and iteration on what it built.
pub fn host_local(data: &[u8]) {
    let (args, config) = args_and_config(data);
    let Ok(conf) = NetConf::parse(config) else {
        return;
    };
    let Ok(cfg) = IpamConfig::load(&conf, &args) else {
        return;
    };
    for set in &cfg.range_sets {
        let _ = set.capacity();
        for r in &set.0 {
            assert!(to_u128(r.start) <= to_u128(r.end), "{r:?}");
            assert!(
                r.subnet.contains(r.start) && r.subnet.contains(r.end),
                "{r:?}"
            );
        }
        let mut seen = HashSet::new();
        for (ip, range) in set.iter_from(cfg.requested.first().copied()).take(64) {
            assert!(set.allocatable(ip) && ip != range.gateway, "{ip}");
            assert!(seen.insert(ip), "{ip} twice");
        }
    }
}

/// The bridge's config loader: first line `CNI_ARGS`, the rest the config; an accepted
/// VLAN id and flag combination is valid.
pub fn bridge_config(data: &[u8]) {
    let (args, config) = args_and_config(data);
    let Ok(conf) = NetConf::parse(config) else {
        return;
    };
    let req = Request {
        args: CmdArgs {
            command: Command::Add,
            container_id: "ctr".into(),
            netns: String::new(),
            ifname: "eth0".into(),
            args,
            path: vec![],
            netns_override: false,
        },
        config: conf,
        stdin: config.to_vec(),
    };
    if let Ok(c) = BridgeConf::load(&req) {
        assert!(c.vlan <= 4094);
        assert!(!(c.hairpin_mode && c.promisc_mode));
    }
}

/// Walks `data` as attributes, and every value as nested attributes down to `depth`:
/// the walk ends, and never yields more attributes than 4-byte headers fit.
fn walk_attrs(data: &[u8], depth: u8) {
    let mut count = 0;
    for attr in attrs(data) {
        let Ok((_, value)) = attr else {
            break;
        };
        count += 1;
        assert!(
            count <= data.len() / 4,
            "{count} attributes in {} bytes",
            data.len()
        );
        if depth > 0 {
            walk_attrs(value, depth - 1);
        }
    }
}

/// A datagram the kernel could send on a rtnetlink socket: split into messages as the
/// socket does, each decoded as the client's requests decode it (link with its VXLAN
/// settings, bridge port VLANs, address, route, FDB entry, neighbour, qdisc, filter,
/// forwarding setting, error and extended ack), and its attributes walked at the offsets
/// of the family headers.
pub fn netlink(data: &[u8]) {
    let mut framed = 0;
    for msg in messages(data) {
        let Ok(msg) = msg else {
            break;
        };
        framed += NLMSG_HDRLEN + msg.payload.len();
        assert!(framed <= data.len(), "messages overrun the datagram");
        if msg.ty == NLMSG_ERROR {
            let _ = msg.error_code();
            let _ = msg.ext_ack_message();
        }
        match decode_reply(&msg) {
            Reply::Link { link, vlans } => {
                if let Ok(link) = link {
                    let _ = link.oper_state.to_string();
                    assert!(!link.name.contains('\0'), "{link:?}");
                    assert!(link.controller != Some(0) && link.peer_index != Some(0));
                    if let Some(vxlan) = link.vxlan {
                        assert_eq!(link.kind.as_deref(), Some("vxlan"), "{link:?}");
                        assert!(vxlan.underlay != Some(0), "{link:?}");
                        assert!(!vxlan.local.is_some_and(|ip| ip.is_unspecified()));
                    }
                }
                if let Some(Ok(vlans)) = vlans {
                    assert!(vlans.len() <= msg.payload.len() / 8);
                }
            }
            Reply::Address(Ok(Some(address))) => {
                let _ = (address.is_tentative(), address.is_global());
                assert_eq!(address.ip.ip().is_ipv4(), address.ip.is_ipv4());
            }
            Reply::Route(Ok(Some(route))) => {
                let _ = route.to_string();
                if let Some(gw) = route.gw {
                    assert_eq!(gw.is_ipv4(), route.dst.is_ipv4(), "{route:?}");
                }
            }
            Reply::Fdb(Ok(Some(entry))) => {
                let _ = (entry.to_string(), entry.is_permanent(), entry.is_self());
                assert!(entry.master != Some(0), "{entry:?}");
            }
            Reply::Neighbour(Ok(Some(neighbour))) => {
                let _ = neighbour.is_permanent();
            }
            Reply::Qdisc(Ok(qdisc)) => {
                assert!(!qdisc.kind.contains('\0'), "{qdisc:?}");
                assert_eq!(qdisc.tbf.is_some(), qdisc.kind == "tbf", "{qdisc:?}");
            }
            Reply::Filter(Ok(filter)) => {
                let _ = filter.redirects_all_to(1);
                assert!(!filter.matches_all || filter.kind == "u32", "{filter:?}");
            }
            _ => {}
        }
        // ifaddrmsg is 8 bytes, rtmsg and ndmsg 12, ifinfomsg 16; netconfmsg and
        // nfgenmsg 4.
        for header in [4, 8, 12, 16] {
            walk_attrs(msg.payload.get(header..).unwrap_or_default(), 3);
        }
    }
}

/// A datagram of an nf_tables rule or set-element dump: every message decoded as the
/// firewall crate reads rules back (chain, handle, comment, expressions, jump target),
/// with the expressions decoded for every chain and for one chain only, and as it reads
/// set elements back (key, comment); and the same bytes as a datagram of an
/// nfnetlink_log group (the agent's deny log: prefix, addresses, ports).
pub fn nftables(data: &[u8]) {
    let _ = cni_firewall::nflog::parse_datagram(data);
    for msg in messages(data) {
        let Ok(msg) = msg else {
            break;
        };
        let all = cni_firewall::decode_dumped_rule(msg.payload, true);
        let one = cni_firewall::decode_dumped_rule(msg.payload, false);
        // Which expressions are decoded never decides whether the rule itself does.
        assert_eq!(all.is_some(), one.is_some());
        // The same bytes as a set-element dump (the port-security sets).
        let _ = cni_firewall::decode_dumped_set_elements(msg.payload);
    }
}

/// A file in cnitool's (libcni's) result cache, which anyone with write access to the
/// cache directory may have planted: read as an entry, listed for GC (a bad entry is
/// reported and skipped, a listed one names a file inside the cache's results
/// directory) and read as the cached result in every version.
pub fn cnitool_cache(data: &[u8]) {
    if let Some(entry) = Entry::from_json(data) {
        // What ADD writes for an entry reads back as the same entry.
        let again = Entry::from_json(&entry.to_json()).expect("an entry's own JSON reads back");
        assert_eq!(again, entry);
    }
    match listed_entry(data) {
        Some(Ok(entry)) => {
            assert_eq!(entry.result, None);
            let dir = Path::new("/var/lib/cni");
            let path = file_path(dir, &entry.network, &entry.container_id, &entry.ifname)
                .expect("a listed entry names its file");
            let name = format!("{}-{}-{}", entry.network, entry.container_id, entry.ifname);
            assert_eq!(
                path.parent(),
                Some(dir.join("results").as_path()),
                "{path:?}"
            );
            assert_eq!(
                path.file_name().and_then(|n| n.to_str()),
                Some(name.as_str())
            );
        }
        Some(Err(why)) => assert!(!why.to_string().is_empty()),
        None => {}
    }
    for version in SUPPORTED_VERSIONS {
        if let Ok(value) = cached_result(data, version) {
            CniResult::parse(&value, version).expect("a converted cached result parses");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TARGETS;
    use std::path::Path;

    /// Every seed and every kept crash (`regressions/<target>/`) through its target.
    #[test]
    fn seeds_and_regressions_pass_their_targets() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut ran = 0;
        for (name, target) in TARGETS {
            for dir in ["seeds", "regressions"] {
                let Ok(files) = std::fs::read_dir(root.join(dir).join(name)) else {
                    continue;
                };
                for file in files {
                    let path = file.unwrap().path();
                    println!("{}", path.display());
                    target(&std::fs::read(&path).unwrap());
                    ran += 1;
                }
            }
        }
        assert!(ran >= TARGETS.len(), "only {ran} inputs");
    }
}

//! host-local: the IPAM config loader (first line `CNI_ARGS`, the rest the config) and,
//! when it accepts, range arithmetic and iteration on what it built.
#![no_main]

use cni_host_local::config::IpamConfig;
use cni_host_local::range::to_u128;
use cni_protocol::NetConf;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (args, config) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (
            String::from_utf8_lossy(&data[..i]).into_owned(),
            &data[i + 1..],
        ),
        None => (String::new(), data),
    };
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
        let mut seen = std::collections::HashSet::new();
        for (ip, range) in set.iter_from(cfg.requested.first().copied()).take(64) {
            assert!(set.allocatable(ip) && ip != range.gateway, "{ip}");
            assert!(seen.insert(ip), "{ip} twice");
        }
    }
});

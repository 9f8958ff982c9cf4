//! The bridge's config loader: first line `CNI_ARGS`, the rest the config.
#![no_main]

use cni_bridge::config::BridgeConf;
use cni_protocol::{CmdArgs, Command, NetConf, Request};
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
});

//! Network config bytes, `CNI_ARGS` and the whole dispatcher: the first byte picks the
//! command, the next line is `CNI_ARGS`, the rest is stdin. Nothing may panic; every
//! failure is one complete error JSON.
#![no_main]

use cni_protocol::{CniArgs, CniError, CniResult, NetConf, Plugin, Request, dispatch};
use libfuzzer_sys::fuzz_target;

/// ADD answers with the prevResult (so printing is fuzzed too); DEL reads the GC list.
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

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let (args, stdin) = match rest.iter().position(|b| *b == b'\n') {
        Some(i) => (
            String::from_utf8_lossy(&rest[..i]).into_owned(),
            &rest[i + 1..],
        ),
        None => (String::new(), rest),
    };
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
});

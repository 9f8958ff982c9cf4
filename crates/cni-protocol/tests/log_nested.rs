//! The operator's log with a command nested in-process (an IPAM plugin run by the
//! multi-call binary): its lines carry its own name and its own end, on its thread only,
//! and the caller's command log goes on unchanged. Its own test binary, because the
//! logger is process-wide and set once.

use cni_protocol::log::{Level, Settings, enter_nested, finish, info, start, step};
use cni_protocol::{CmdArgs, Command};

#[test]
fn a_nested_command_logs_under_its_own_name_on_its_thread_only() {
    let dir = std::env::temp_dir().join(format!("cni-log-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cni.log");
    let args = |command| CmdArgs {
        command,
        container_id: "c1".into(),
        netns: String::new(),
        ifname: "eth0".into(),
        args: String::new(),
        path: Vec::new(),
        netns_override: false,
    };
    let settings = Settings {
        file: file.clone(),
        level: Level::Debug,
    };
    start(settings, "bridge", &args(Command::Del));
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let guard = enter_nested("host-local", &args(Command::Del));
            info("released 10.0.0.2");
            step("host-local/del/release");
            {
                let _inner = enter_nested("deeper", &args(Command::Check));
                info("inner");
            }
            finish(None);
            drop(guard);
            info("after the nested command");
        });
    });
    info("on the caller's thread");
    finish(None);
    let text = std::fs::read_to_string(&file).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let lines: Vec<&str> = text.lines().collect();
    let find = |msg: &str| {
        lines
            .iter()
            .find(|l| l.contains(msg))
            .unwrap_or_else(|| panic!("no {msg:?} in:\n{text}"))
            .to_string()
    };
    assert!(find("released 10.0.0.2").contains(" plugin=host-local cmd=DEL container=c1"));
    assert!(find("step=host-local/del/release").contains(" plugin=host-local "));
    assert!(find("msg=inner").contains(" plugin=deeper cmd=CHECK "));
    let oks: Vec<&&str> = lines.iter().filter(|l| l.contains("msg=ok")).collect();
    assert_eq!(oks.len(), 2, "{text}");
    assert!(oks[0].contains(" plugin=host-local "), "{text}");
    assert!(oks[1].contains(" plugin=bridge "), "{text}");
    assert!(find("after the nested command").contains(" plugin=bridge "));
    assert!(find("on the caller's thread").contains(" plugin=bridge "));
}

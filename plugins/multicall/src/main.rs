//! The one shipped executable: `bridge`, `host-local`, `loopback`, `portmap` and `bandwidth` in one multi-call
//! binary, installed under each plugin's name (hard links of one file). It runs the plugin
//! it is started as, and runs an IPAM delegate that `CNI_PATH` resolves to this same file
//! in-process instead of exec'ing it (see `cni_protocol::inproc`).

use cni_protocol::inproc::Builtin;

/// Every plugin of the suite, by its installed name.
static PLUGINS: [Builtin; 5] = [
    Builtin {
        name: "bridge",
        plugin: &cni_bridge::Bridge,
    },
    Builtin {
        name: "host-local",
        plugin: &cni_host_local::HostLocal,
    },
    Builtin {
        name: "loopback",
        plugin: &cni_loopback::Loopback,
    },
    Builtin {
        name: "portmap",
        plugin: &cni_portmap::Portmap,
    },
    Builtin {
        name: "bandwidth",
        plugin: &cni_bandwidth::Bandwidth,
    },
];

fn main() -> std::process::ExitCode {
    cni_protocol::inproc::run_multicall(&PLUGINS, cni_build_stamp::about)
}

//! The containerd `conf_template` we ship (`deploy/kubernetes/containerd-cni.conflist.tmpl`),
//! rendered as containerd renders it (Go's text/template with `PodCIDR`, `PodCIDRRanges`,
//! `Routes`; the renderer is `tests/interop/conf-template`), makes a pod the way
//! containerd's libcni runs the list: our `bridge` (with `host-local`), then `portmap`,
//! `bandwidth` and `loopback` with the bridge's result, in throwaway host and pod
//! namespaces. Single- and dual-stack
//! nodes. The rendered `dataDir` is pointed at a temp dir (the template leaves the
//! default, /var/lib/cni/networks, which belongs to the machine).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use cni_blackbox::{Netns, Plugin, TempDir, kernel, require_root, unique_name, workspace_root};
use serde_json::{Value, json};

/// Builds the renderer once per test process (offline: standard library only).
fn renderer() -> &'static Path {
    static RENDERER: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = RENDERER.get_or_init(|| {
        let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let out = scratch.join("conf-template");
        let result = Command::new("go")
            .args(["build", "-o"])
            .arg(&out)
            .arg("main.go")
            .current_dir(workspace_root().join("tests/interop/conf-template"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", scratch)
            .env("GO111MODULE", "off")
            .env("GOFLAGS", "")
            .env("GOENV", "off")
            .env("GOCACHE", scratch.join("go-build-cache"))
            .env("CGO_ENABLED", "0")
            .output()
            .map_err(|e| {
                format!("cannot run `go build` ({e}); install golang-go (tests/run-all.sh does)")
            })?;
        if result.status.success() {
            Ok(out)
        } else {
            Err(format!(
                "go build of the conf-template renderer failed: {}",
                String::from_utf8_lossy(&result.stderr)
            ))
        }
    });
    match built {
        Ok(path) => path,
        Err(e) => panic!("{e}"),
    }
}

/// The shipped template rendered for a node with `cidrs`.
fn render(cidrs: &[&str]) -> Value {
    let out = Command::new(renderer())
        .arg(workspace_root().join("deploy/kubernetes/containerd-cni.conflist.tmpl"))
        .args(cidrs)
        .output()
        .expect("run the renderer");
    assert!(
        out.status.success(),
        "rendering failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the rendered template is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn rendered_template_has_our_plugins_and_every_pod_cidr() {
    // Rendering needs no root; only running the plugins does.
    let dual = render(&["10.244.1.0/24", "fd00:10:244:1::/64"]);
    let types: Vec<&str> = dual["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .filter_map(|p| p["type"].as_str())
        .collect();
    assert_eq!(types, ["bridge", "portmap", "bandwidth", "loopback"]);
    // The pod annotations reach the plugin, and containerd's 2^32-1 bit burst is capped
    // to what the rate sends in 20 ms, as cni-node's own conflist does.
    let bandwidth = &dual["plugins"][2];
    assert_eq!(bandwidth["capabilities"], json!({"bandwidth": true}));
    assert_eq!(bandwidth["maxBurstMs"], json!(20));
    let ipam = &dual["plugins"][0]["ipam"];
    assert_eq!(ipam["type"], "host-local");
    assert_eq!(
        ipam["ranges"],
        json!([[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]])
    );
    assert_eq!(
        ipam["routes"],
        json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}])
    );

    let single = render(&["10.244.2.0/24"]);
    assert_eq!(
        single["plugins"][0]["ipam"]["ranges"],
        json!([[{"subnet": "10.244.2.0/24"}]])
    );
    assert_eq!(
        single["plugins"][0]["ipam"]["routes"],
        json!([{"dst": "0.0.0.0/0"}])
    );
}

#[test]
fn rendered_template_makes_a_dual_stack_pod_with_our_plugins() {
    if !require_root() {
        return;
    }
    let conflist = render(&["10.244.1.0/24", "fd00:10:244:1::/64"]);
    let host = Netns::new("cnibb-tmpl-host");
    let pod = Netns::new("cnibb-tmpl-pod");
    let data = TempDir::new("cnibb-tmpl-data");
    let id = unique_name("cnibb-tmpl");

    // As libcni does: each plugin gets the list's name and cniVersion, the next one the
    // previous result.
    let plugin_conf = |index: usize, prev: Option<&Value>| {
        let mut conf = conflist["plugins"][index].clone();
        conf["name"] = conflist["name"].clone();
        conf["cniVersion"] = conflist["cniVersion"].clone();
        if conf["ipam"].is_object() {
            conf["ipam"]["dataDir"] = json!(data.path_str());
        }
        if let Some(prev) = prev {
            conf["prevResult"] = prev.clone();
        }
        conf
    };
    let bridge_conf = plugin_conf(0, None);
    let added = Plugin::new("bridge", &host)
        .command("ADD")
        .attachment(&id, &pod, "eth0")
        .config(&bridge_conf)
        .run();
    added.assert_success();
    let result = added.json();
    // portmap with the pod's host ports, as containerd passes the capability.
    let mut portmap_conf = plugin_conf(1, Some(&result));
    portmap_conf["runtimeConfig"] = json!({"portMappings": [
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": ""}
    ]});
    let mapped = Plugin::new("portmap", &host)
        .command("ADD")
        .attachment(&id, &pod, "eth0")
        .config(&portmap_conf)
        .run();
    mapped.assert_success();
    assert_eq!(
        mapped.json(),
        result,
        "portmap passes the bridge's result on"
    );
    // bandwidth with the pod annotations, as containerd passes them: its burst of
    // 2^32-1 bits is capped by the template's `maxBurstMs`.
    let mut bandwidth_conf = plugin_conf(2, Some(&result));
    bandwidth_conf["runtimeConfig"] = json!({"bandwidth": {
        "ingressRate": 10_000_000u64, "ingressBurst": 4_294_967_295u64,
        "egressRate": 10_000_000u64, "egressBurst": 4_294_967_295u64,
    }});
    let shaped = Plugin::new("bandwidth", &host)
        .command("ADD")
        .attachment(&id, &pod, "eth0")
        .config(&bandwidth_conf)
        .run();
    shaped.assert_success();
    // As the reference does, bandwidth adds its ifb device to the result; the rest of
    // the list, and DEL, get the result with it.
    let bridge_result = result;
    let result = shaped.json();
    let mut without_ifb = result.clone();
    let ifb = without_ifb["interfaces"]
        .as_array_mut()
        .and_then(|interfaces| interfaces.pop())
        .expect("an interface added by bandwidth");
    assert!(
        ifb["name"].as_str().is_some_and(|n| n.starts_with("bwp")),
        "bandwidth's last interface is not its ifb device: {ifb}"
    );
    assert_eq!(
        without_ifb, bridge_result,
        "bandwidth passes the bridge's result on"
    );
    let host_veth = result["interfaces"][1]["name"]
        .as_str()
        .expect("the host veth in the result")
        .to_owned();
    let qdiscs = String::from_utf8_lossy(
        &host
            .exec(&["tc", "qdisc", "show", "dev", &host_veth])
            .stdout,
    )
    .into_owned();
    // 10 Mbit/s for 20 ms is 25 kB; the reference would keep containerd's 512 MB.
    assert!(
        qdiscs.contains("qdisc tbf") && qdiscs.contains("burst 25000b"),
        "no 10 Mbit/s bucket with a 20 ms burst on {host_veth}:\n{qdiscs}"
    );
    let ifbs = || {
        kernel::links(&host)
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
            .filter(|n| n.starts_with("bwp"))
            .collect::<Vec<_>>()
    };
    assert_eq!(ifbs().len(), 1, "one ifb device for the pod's egress");
    let loopback_conf = plugin_conf(3, Some(&result));
    let chained = Plugin::new("loopback", &host)
        .command("ADD")
        .attachment(&id, &pod, "eth0")
        .config(&loopback_conf)
        .run();
    chained.assert_success();
    assert_eq!(
        chained.json(),
        result,
        "loopback passes the bridge's result on"
    );

    let addrs = kernel::addr_cidrs(&pod, "eth0");
    for want in ["10.244.1.2/24", "fd00:10:244:1::2/64"] {
        assert!(addrs.iter().any(|a| a == want), "{want} not in {addrs:?}");
    }
    assert!(kernel::link_is_up(&pod, "lo"), "lo is down");
    let default4 = kernel::routes(&pod);
    assert!(
        default4
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["dst"] == "default" && r["gateway"] == "10.244.1.1"),
        "no IPv4 default route via the bridge: {default4}"
    );
    let default6 = kernel::routes6(&pod);
    assert!(
        default6
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["dst"] == "default" && r["gateway"] == "fd00:10:244:1::1"),
        "no IPv6 default route via the bridge: {default6}"
    );
    let gateways = kernel::addr_cidrs(&host, "cni0");
    for want in ["10.244.1.1/24", "fd00:10:244:1::1/64"] {
        assert!(
            gateways.iter().any(|g| g == want),
            "{want} not on cni0: {gateways:?}"
        );
    }

    // containerd deletes in reverse order, with the cached result.
    for (name, conf) in [
        ("loopback", &loopback_conf),
        ("bandwidth", &bandwidth_conf),
        ("portmap", &portmap_conf),
        ("bridge", &plugin_conf(0, Some(&result))),
    ] {
        Plugin::new(name, &host)
            .command("DEL")
            .attachment(&id, &pod, "eth0")
            .config(conf)
            .run()
            .assert_success_silent();
    }
    assert!(kernel::link(&pod, "eth0").is_none(), "eth0 left after DEL");
    assert!(
        ifbs().is_empty(),
        "ifb devices left after DEL: {:?}",
        ifbs()
    );
    assert_eq!(
        cni_blackbox::ipam::reservations(&data.path().join("k8s-pod-network")).len(),
        0,
        "reservations left after DEL"
    );
    let nat =
        String::from_utf8_lossy(&host.exec(&["iptables-save", "-t", "nat"]).stdout).into_owned();
    assert!(!nat.contains(&id), "host port rules left after DEL:\n{nat}");
}

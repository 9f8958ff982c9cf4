//! The network-list operations of libcni (`AddNetworkList`, `CheckNetworkList`,
//! `DelNetworkList`, `GCNetworkList`, `GetStatusNetworkList`): which plugins run in which
//! order, what each gets on stdin, and how the result cache is used.
//!
//! - ADD runs the plugins in order, each getting the previous one's result as
//!   `prevResult` (in the version that plugin printed it), and caches the last result.
//! - CHECK (config 0.4.0 and later) runs them in order with the cached result, converted
//!   to the config's version, as `prevResult`; `disableCheck` skips it.
//! - DEL runs them in reverse order with the cached result as `prevResult` (0.4.0 and
//!   later), then removes the cache entry.
//! - GC deletes every cached attachment of the network that is not in the valid set, then
//!   (1.1.0 and later) sends GC with `cni.dev/valid-attachments` to every plugin.
//! - STATUS (1.1.0 and later) asks every plugin in order and stops at the first failure.
//!
//! Every plugin's stdin is its own config with the list's `name` and `cniVersion` put in
//! and `runtimeConfig` holding only the capability args the plugin declares in
//! `capabilities`.

use crate::cache::{self, Entry};
use crate::config::{NetworkConfigList, PluginConfig};
use crate::error::Error;
use crate::exec::{self, Args, PluginPath};
use cni_protocol::env::{self, validate_container_id, validate_ifname};
use cni_protocol::json::sort_keys;
use cni_protocol::{CniError, CniResult, Command, Version};
use serde_json::{Map, Value};
use std::path::PathBuf;

/// One attachment as the runtime describes it (libcni's `RuntimeConf`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeConf {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`.
    pub netns: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS` pairs.
    pub args: Vec<(String, String)>,
    /// Capability args; each plugin gets those it declares.
    pub capability_args: Map<String, Value>,
}

impl RuntimeConf {
    fn exec_args(&self) -> Args<'_> {
        Args {
            container_id: &self.container_id,
            netns: &self.netns,
            ifname: &self.ifname,
            plugin_args: &self.args,
        }
    }
}

/// An attachment GC must keep: `{"containerID": ..., "ifname": ...}` in the GC config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcAttachment {
    /// Container id.
    pub container_id: String,
    /// Interface name in the container.
    pub ifname: String,
}

/// Where plugins are found and results are cached (libcni's `CNIConfig`).
#[derive(Debug, Clone)]
pub struct Cni {
    /// `CNI_PATH`.
    pub path: PluginPath,
    /// The cache directory (holding `results/`).
    pub cache_dir: PathBuf,
}

/// Whether `version` is at least `min` (an unparsable version is an error).
fn at_least(version: &str, min: &str) -> Result<bool, Error> {
    let parse = |v: &str| Version::parse(v).map_err(|e| Error::Config(e.to_string()));
    Ok(parse(version)? >= parse(min)?)
}

/// A plugin's stdin: its config with `inject` put in at the top level, keys sorted and
/// compact as Go marshals a map.
fn inject(plugin: &PluginConfig, inject: Vec<(&str, Value)>) -> Vec<u8> {
    let mut config = plugin.raw.clone();
    for (key, value) in inject {
        config.insert(key.to_string(), value);
    }
    serde_json::to_vec(&sort_keys(Value::Object(config))).unwrap_or_default()
}

impl Cni {
    /// libcni's `buildOneConfig`: name, cniVersion, prevResult, and the capability args
    /// this plugin declares as `runtimeConfig` (replacing any written in the file).
    fn build_one_config(
        list: &NetworkConfigList,
        plugin: &PluginConfig,
        prev_result: Option<&Value>,
        rt: &RuntimeConf,
    ) -> Vec<u8> {
        let mut values = vec![
            ("name", Value::from(list.name.clone())),
            ("cniVersion", Value::from(list.cni_version.clone())),
        ];
        if let Some(prev) = prev_result {
            values.push(("prevResult", prev.clone()));
        }
        let runtime: Map<String, Value> = plugin
            .capabilities
            .iter()
            .filter(|(_, enabled)| **enabled)
            .filter_map(|(cap, _)| {
                rt.capability_args
                    .get(cap)
                    .map(|value| (cap.clone(), value.clone()))
            })
            .collect();
        if !runtime.is_empty() {
            values.push(("runtimeConfig", Value::Object(runtime)));
        }
        inject(plugin, values)
    }

    fn run(
        &self,
        plugin: &PluginConfig,
        command: Command,
        args: &Args<'_>,
        stdin: &[u8],
    ) -> Result<Vec<u8>, CniError> {
        let binary = self.path.find(&plugin.plugin_type)?;
        exec::exec_plugin(&binary, command, args, &self.path, stdin)
    }

    /// ADD of the whole list; returns the last plugin's result (also cached).
    pub fn add(&self, list: &NetworkConfigList, rt: &RuntimeConf) -> Result<CniResult, Error> {
        let mut result: Option<CniResult> = None;
        for plugin in &list.plugins {
            let failed = |source: CniError| Error::Plugin {
                plugin: plugin.description(),
                command: "add",
                source,
            };
            let binary = self.path.find(&plugin.plugin_type).map_err(failed)?;
            validate_container_id(&rt.container_id).map_err(failed)?;
            validate_network_name(&list.name).map_err(failed)?;
            validate_ifname(&rt.ifname).map_err(failed)?;
            // The previous plugin's result goes on in the version it was printed in.
            let prev = match &result {
                Some(r) => Some(result_value(r, &r.cni_version).map_err(failed)?),
                None => None,
            };
            let stdin = Self::build_one_config(list, plugin, prev.as_ref(), rt);
            let out = exec::exec_plugin(&binary, Command::Add, &rt.exec_args(), &self.path, &stdin)
                .map_err(failed)?;
            result = Some(exec::parse_result(&list.cni_version, &out).map_err(failed)?);
        }
        let result = result.ok_or_else(|| Error::Config("no plugin configs found".into()))?;
        let cache_error = |source: Error| Error::CacheWrite {
            network: list.name.clone(),
            source: Box::new(source),
        };
        let entry = Entry {
            container_id: rt.container_id.clone(),
            config: list.bytes.clone(),
            ifname: rt.ifname.clone(),
            network: list.name.clone(),
            netns: rt.netns.clone(),
            cni_args: rt.args.clone(),
            capability_args: rt.capability_args.clone(),
            result: Some(
                result_value(&result, &result.cni_version)
                    .map_err(|e| cache_error(Error::CacheResult(e)))?,
            ),
        };
        cache::write(&self.cache_dir, &entry).map_err(cache_error)?;
        Ok(result)
    }

    /// CHECK of the whole list against the cached result.
    pub fn check(&self, list: &NetworkConfigList, rt: &RuntimeConf) -> Result<(), Error> {
        if !at_least(&list.cni_version, "0.4.0")? {
            return Err(Error::CheckNotSupported(list.cni_version.clone()));
        }
        if list.disable_check {
            return Ok(());
        }
        let cached = cache::read_result(
            &self.cache_dir,
            &list.name,
            &rt.container_id,
            &rt.ifname,
            &list.cni_version,
        )
        .map_err(|source| Error::CacheRead {
            network: list.name.clone(),
            source: Box::new(source),
        })?;
        for plugin in &list.plugins {
            let stdin = Self::build_one_config(list, plugin, cached.as_ref(), rt);
            self.run(plugin, Command::Check, &rt.exec_args(), &stdin)
                .map_err(|source| Error::Plugin {
                    plugin: plugin.description(),
                    command: "check",
                    source,
                })?;
        }
        Ok(())
    }

    /// DEL of the whole list, last plugin first, then the cache entry goes.
    pub fn del(&self, list: &NetworkConfigList, rt: &RuntimeConf) -> Result<(), Error> {
        let mut cached = None;
        if at_least(&list.cni_version, "0.4.0")? {
            match cache::read_result(
                &self.cache_dir,
                &list.name,
                &rt.container_id,
                &rt.ifname,
                &list.cni_version,
            ) {
                Ok(result) => cached = result,
                // An unreadable entry is dropped; DEL goes on without a prevResult.
                Err(_) => cache::remove(&self.cache_dir, &list.name, &rt.container_id, &rt.ifname),
            }
        }
        for plugin in list.plugins.iter().rev() {
            let stdin = Self::build_one_config(list, plugin, cached.as_ref(), rt);
            self.run(plugin, Command::Del, &rt.exec_args(), &stdin)
                .map_err(|source| Error::Plugin {
                    plugin: plugin.description(),
                    command: "delete",
                    source,
                })?;
        }
        cache::remove(&self.cache_dir, &list.name, &rt.container_id, &rt.ifname);
        Ok(())
    }

    /// GC: DEL of every cached attachment of this network not in `valid`, then GC to every
    /// plugin. With `valid` `None` no valid list is sent and every attachment is stale.
    pub fn gc(
        &self,
        list: &NetworkConfigList,
        valid: Option<&[GcAttachment]>,
    ) -> Result<(), Error> {
        if list.disable_gc {
            return Ok(());
        }
        // libcni gives up silently when the cache cannot be listed.
        let Ok(cached) = cache::attachments(&self.cache_dir) else {
            return Ok(());
        };
        let mut errors = Vec::new();
        for entry in cached.iter().filter(|e| e.network == list.name) {
            let keep = valid
                .unwrap_or_default()
                .iter()
                .any(|v| v.container_id == entry.container_id && v.ifname == entry.ifname);
            if keep {
                continue;
            }
            let rt = RuntimeConf {
                container_id: entry.container_id.clone(),
                netns: entry.netns.clone(),
                ifname: entry.ifname.clone(),
                args: entry.cni_args.clone(),
                capability_args: entry.capability_args.clone(),
            };
            if let Err(e) = self.del(list, &rt) {
                errors.push(Error::StaleAttachment {
                    container_id: rt.container_id,
                    ifname: rt.ifname,
                    source: Box::new(e),
                });
            }
        }
        if at_least(&list.cni_version, "1.1.0").unwrap_or(false) {
            let mut values = vec![
                ("name", Value::from(list.name.clone())),
                ("cniVersion", Value::from(list.cni_version.clone())),
            ];
            if let Some(valid) = valid {
                let items: Value = valid
                    .iter()
                    .map(|a| serde_json::json!({"containerID": a.container_id, "ifname": a.ifname}))
                    .collect();
                values.push(("cni.dev/valid-attachments", items.clone()));
                // The key the spec first named (containernetworking/cni#1101).
                values.push(("cni.dev/attachments", items));
            }
            for plugin in &list.plugins {
                let stdin = inject(plugin, values.clone());
                if let Err(source) = self.run(plugin, Command::Gc, &Args::default(), &stdin) {
                    errors.push(Error::Gc {
                        plugin: plugin.plugin_type.clone(),
                        source,
                    });
                }
            }
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Many(errors)),
        }
    }

    /// STATUS of every plugin, in order; the first failure is the answer.
    pub fn status(&self, list: &NetworkConfigList) -> Result<(), Error> {
        if !at_least(&list.cni_version, "1.1.0").unwrap_or(false) {
            return Ok(());
        }
        let values = vec![
            ("name", Value::from(list.name.clone())),
            ("cniVersion", Value::from(list.cni_version.clone())),
        ];
        for plugin in &list.plugins {
            let stdin = inject(plugin, values.clone());
            self.run(plugin, Command::Status, &Args::default(), &stdin)
                .map_err(|source| Error::Plugin {
                    plugin: plugin.description(),
                    command: "status",
                    source,
                })?;
        }
        Ok(())
    }
}

/// A result as JSON in `version`'s shape.
fn result_value(result: &CniResult, version: &str) -> Result<Value, CniError> {
    let text = result.to_json(version)?;
    serde_json::from_str(&text).map_err(|e| CniError::internal(e.to_string()))
}

/// libcni's network name rule: the plugins' ([`env::validate_network_name`]), with
/// libcni's words for a missing name.
fn validate_network_name(name: &str) -> Result<(), CniError> {
    if name.is_empty() {
        return Err(CniError::invalid_config("missing network name:"));
    }
    env::validate_network_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list(text: &str) -> NetworkConfigList {
        NetworkConfigList::from_bytes(text.as_bytes()).unwrap()
    }

    #[test]
    fn stdin_has_name_version_prev_result_and_only_declared_capabilities() {
        let l = list(
            r#"{"name":"net","cniVersion":"1.0.0","plugins":[
                {"type":"bridge","runtimeConfig":{"stale":1}},
                {"type":"portmap","capabilities":{"portMappings":true,"bandwidth":false,"ips":true}}]}"#,
        );
        let mut caps = Map::new();
        caps.insert("portMappings".into(), json!([{"hostPort": 80}]));
        caps.insert("bandwidth".into(), json!({"rate": 1}));
        caps.insert("mac".into(), json!("aa"));
        let rt = RuntimeConf {
            capability_args: caps,
            ..RuntimeConf::default()
        };
        let first: Value =
            serde_json::from_slice(&Cni::build_one_config(&l, &l.plugins[0], None, &rt)).unwrap();
        assert_eq!(
            first,
            json!({"cniVersion": "1.0.0", "name": "net", "runtimeConfig": {"stale": 1}, "type": "bridge"})
        );
        let prev = json!({"cniVersion": "1.0.0"});
        let text = Cni::build_one_config(&l, &l.plugins[1], Some(&prev), &rt);
        let second: Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(second["prevResult"], prev);
        assert_eq!(
            second["runtimeConfig"],
            json!({"portMappings": [{"hostPort": 80}]})
        );
        assert_eq!(second["name"], "net");
        // Keys sorted, compact: as Go marshals a map.
        let text = String::from_utf8(text).unwrap();
        assert!(text.starts_with(r#"{"capabilities":"#), "{text}");
    }

    #[test]
    fn network_names_are_validated_as_libcni() {
        assert!(validate_network_name("my-net.1_x").is_ok());
        assert_eq!(
            validate_network_name("").unwrap_err().msg,
            "missing network name:"
        );
        assert_eq!(
            validate_network_name("a/b").unwrap_err().to_string(),
            "invalid characters found in network name; a/b"
        );
    }

    #[test]
    fn version_gates() {
        assert!(at_least("0.4.0", "0.4.0").unwrap());
        assert!(!at_least("0.3.1", "0.4.0").unwrap());
        assert!(at_least("1.1.0", "0.4.0").unwrap());
        assert!(!at_least("", "0.4.0").unwrap());
        assert!(at_least("x", "0.4.0").is_err());
    }
}

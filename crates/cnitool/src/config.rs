//! Network config loading as libcni does it (`LoadNetworkConf`): `*.conflist` files in
//! name order, then single-plugin `*.conf`/`*.json` files upgraded to a one-plugin list;
//! the first whose `name` matches wins. Also the list-level keys libcni reads
//! (`cniVersions` negotiation, `disableCheck`, `disableGC`, `loadOnlyInlinedPlugins`) and
//! plugin configs kept from `<dir>/<network>/*.conf`.

use crate::error::Error;
use cni_protocol::json::json_kind;
use cni_protocol::{CURRENT_VERSION, Version};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One plugin of a list: the keys libcni looks at, and the whole object it sends on.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    /// `type`: the binary to run.
    pub plugin_type: String,
    /// `name`, empty when absent (libcni injects the list's).
    pub name: String,
    /// `capabilities`: which runtime capability args this plugin takes.
    pub capabilities: BTreeMap<String, bool>,
    /// The plugin's config object as written.
    pub raw: Map<String, Value>,
}

impl PluginConfig {
    /// libcni's `NetworkPluginConfFromBytes` on an already parsed value.
    pub fn from_value(value: &Value) -> Result<Self, Error> {
        let bad = |what: String| Error::Config(format!("error parsing configuration: {what}"));
        let Value::Object(raw) = value else {
            return Err(bad(format!(
                "json: cannot unmarshal {} into Go value of type types.PluginConf",
                json_kind(value)
            )));
        };
        let text = |key: &str| match raw.get(key) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(bad(format!(
                "json: cannot unmarshal {} into Go struct field PluginConf.{key} of type string",
                json_kind(other)
            ))),
        };
        let plugin_type = text("type")?;
        let name = text("name")?;
        text("cniVersion")?;
        let mut capabilities = BTreeMap::new();
        match raw.get("capabilities") {
            None | Some(Value::Null) => {}
            Some(Value::Object(caps)) => {
                for (key, enabled) in caps {
                    let Value::Bool(enabled) = enabled else {
                        return Err(bad(format!(
                            "json: cannot unmarshal {} into Go struct field PluginConf.capabilities of type bool",
                            json_kind(enabled)
                        )));
                    };
                    capabilities.insert(key.clone(), *enabled);
                }
            }
            Some(other) => {
                return Err(bad(format!(
                    "json: cannot unmarshal {} into Go struct field PluginConf.capabilities of type map[string]bool",
                    json_kind(other)
                )));
            }
        }
        if plugin_type.is_empty() {
            return Err(bad("missing 'type'".into()));
        }
        Ok(Self {
            plugin_type,
            name,
            capabilities,
            raw: raw.clone(),
        })
    }

    /// libcni's description of a plugin in errors: `type="bridge" name="mynet"`.
    pub fn description(&self) -> String {
        let mut out = format!("type={:?}", self.plugin_type);
        if !self.name.is_empty() {
            out.push_str(&format!(" name={:?}", self.name));
        }
        out
    }
}

/// A network: the plugin list and the list-level settings.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfigList {
    /// `name`.
    pub name: String,
    /// The version every plugin is called with (after `cniVersions` negotiation).
    pub cni_version: String,
    /// `disableCheck`: CHECK succeeds without running the plugins.
    pub disable_check: bool,
    /// `disableGC`: GC does nothing.
    pub disable_gc: bool,
    /// `loadOnlyInlinedPlugins`: ignore `<dir>/<name>/*.conf`.
    pub load_only_inlined_plugins: bool,
    /// The plugins, in ADD order.
    pub plugins: Vec<PluginConfig>,
    /// The list's bytes as read (what libcni keeps in its cache entry's `config`).
    pub bytes: Vec<u8>,
}

impl NetworkConfigList {
    /// libcni's `NetworkConfFromBytes`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, Error> {
        let bad = list_error;
        let value: Value = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        let Value::Object(raw) = value else {
            return Err(bad(format!(
                "json: cannot unmarshal {} into Go value of type map[string]interface {{}}",
                json_kind(&value)
            )));
        };
        let name = match raw.get("name") {
            None => return Err(bad("no name".into())),
            Some(Value::String(s)) => s.clone(),
            Some(other) => return Err(bad(format!("invalid name type {}", go_type(other)))),
        };
        let mut cni_version = match raw.get("cniVersion") {
            None => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(bad(format!("invalid cniVersion type {}", go_type(other))));
            }
        };
        if let Some(versions) = raw.get("cniVersions") {
            cni_version = negotiate(versions, &cni_version)?;
        }
        let read_bool = |key: &str| match raw.get(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(Value::String(s)) => match s.to_lowercase().as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                lower => Err(bad(format!("invalid value {lower:?} for {key}"))),
            },
            Some(other) => Err(bad(format!("invalid type {} for {key}", go_type(other)))),
        };
        let disable_check = read_bool("disableCheck")?;
        let disable_gc = read_bool("disableGC")?;
        let load_only_inlined_plugins = read_bool("loadOnlyInlinedPlugins")?;
        let mut list = Self {
            name,
            cni_version,
            disable_check,
            disable_gc,
            load_only_inlined_plugins,
            plugins: Vec::new(),
            bytes: bytes.to_vec(),
        };
        let plugins = match raw.get("plugins") {
            None if load_only_inlined_plugins => {
                return Err(bad(
                    "`loadOnlyInlinedPlugins` is true, and no 'plugins' key".into(),
                ));
            }
            None => return Ok(list),
            Some(Value::Array(plugins)) => plugins,
            Some(other) => return Err(bad(format!("invalid 'plugins' type {}", go_type(other)))),
        };
        if plugins.is_empty() {
            return Err(bad("no plugins in list".into()));
        }
        for (i, plugin) in plugins.iter().enumerate() {
            let plugin = PluginConfig::from_value(plugin)
                .map_err(|e| Error::Config(format!("failed to parse plugin config {i}: {e}")))?;
            list.plugins.push(plugin);
        }
        Ok(list)
    }

    /// libcni's `NetworkConfFromFile`: the list, plus `<dir>/<name>/*.conf` plugin
    /// configs unless `loadOnlyInlinedPlugins`; a network without plugins is an error.
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let bytes = read(path)?;
        let mut list = Self::from_bytes(&bytes)?;
        if !list.load_only_inlined_plugins {
            let dir = path.parent().unwrap_or(Path::new(".")).join(&list.name);
            let files = conf_files(&dir, &[".conf"]).map_err(|e| {
                Error::Config(format!(
                    "failed to read plugin config files in {}: {e}",
                    dir.display()
                ))
            })?;
            for file in files {
                let value: Value = serde_json::from_slice(&read(&file)?)
                    .map_err(|e| Error::Config(format!("error parsing configuration: {e}")))?;
                list.plugins.push(PluginConfig::from_value(&value)?);
            }
        }
        if list.plugins.is_empty() {
            return Err(Error::Config("no plugin configs found".into()));
        }
        Ok(list)
    }

    /// libcni's `ConfListFromConf`: a single-plugin config as a one-plugin list.
    fn from_single(plugin: &PluginConfig) -> Result<Self, Error> {
        let version = plugin.raw.get("cniVersion").cloned().unwrap_or_default();
        let version = match version {
            Value::Null => Value::String(String::new()),
            v => v,
        };
        let list = serde_json::json!({
            "cniVersion": version,
            "name": plugin.name,
            "plugins": [Value::Object(plugin.raw.clone())],
        });
        let bytes = serde_json::to_vec(&cni_protocol::json::sort_keys(list))
            .map_err(|e| Error::Config(e.to_string()))?;
        Self::from_bytes(&bytes)
    }
}

/// libcni's words for a config list it cannot parse.
fn list_error(what: String) -> Error {
    Error::Config(format!("error parsing configuration list: {what}"))
}

/// `cniVersions`: the highest listed version (with `cniVersion`) that libcni speaks.
fn negotiate(versions: &Value, cni_version: &str) -> Result<String, Error> {
    let version = |what: String, text: &str| {
        Version::parse(text).map_err(|source| Error::Version { what, source })
    };
    let current = version(format!("cniVersion {CURRENT_VERSION}"), CURRENT_VERSION)?;
    let Value::Array(items) = versions else {
        return Err(list_error(format!(
            "invalid type for cniVersions: {}",
            go_type(versions)
        )));
    };
    let mut usable = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Value::String(text) = item else {
            return Err(list_error(format!(
                "invalid type for cniVersions index {i}: {}",
                go_type(item)
            )));
        };
        let parsed = version(format!("cniVersions entry {text} at index {i}"), text)?;
        // Versions newer than this implementation of the spec are skipped.
        if parsed <= current {
            usable.push((parsed, text.clone()));
        }
    }
    if !cni_version.is_empty() {
        let parsed = version(format!("cniVersion {cni_version}"), cni_version)?;
        if parsed <= current {
            usable.push((parsed, cni_version.to_string()));
        }
    }
    Ok(usable
        .into_iter()
        .max_by_key(|(v, _)| *v)
        .map_or_else(|| cni_version.to_string(), |(_, text)| text))
}

/// libcni's `LoadNetworkConf`: the network named `name` in `dir`.
pub fn load(dir: &Path, name: &str) -> Result<NetworkConfigList, Error> {
    let lists = conf_files(dir, &[".conflist"]).map_err(|source| Error::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    for file in &lists {
        let list = NetworkConfigList::from_file(file)?;
        if list.name == name {
            return Ok(list);
        }
    }
    // Single-plugin configs, the older format, upgraded to a list.
    let singles = conf_files(dir, &[".conf", ".json"]).map_err(|source| Error::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    if singles.is_empty() {
        return Err(if lists.is_empty() {
            Error::NoConfigs {
                dir: dir.to_path_buf(),
            }
        } else {
            Error::NotFound {
                dir: dir.to_path_buf(),
                name: name.to_string(),
            }
        });
    }
    for file in &singles {
        let value: Value = serde_json::from_slice(&read(file)?)
            .map_err(|e| Error::Config(format!("error parsing configuration: {e}")))?;
        let plugin = PluginConfig::from_value(&value)?;
        if plugin.name == name {
            return NetworkConfigList::from_single(&plugin);
        }
    }
    Err(Error::NotFound {
        dir: dir.to_path_buf(),
        name: name.to_string(),
    })
}

/// libcni's `ConfFiles`, sorted: files (not directories) of `dir` whose extension (Go's
/// `filepath.Ext`: from the last dot of the name) is one of `extensions`. A missing
/// directory has none.
pub fn conf_files(dir: &Path, extensions: &[&str]) -> std::io::Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            continue;
        }
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ext = name.rfind('.').map_or("", |i| &name[i..]);
        if extensions.contains(&ext) {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Go's `%T` of a decoded JSON value.
fn go_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A scratch directory removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "cnitool-conf-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn write(&self, name: &str, text: &str) {
            let path = self.0.join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn list(text: &str) -> Result<NetworkConfigList, Error> {
        NetworkConfigList::from_bytes(text.as_bytes())
    }

    #[test]
    fn conflists_come_first_in_name_order_then_single_configs() {
        let dir = Scratch::new("order");
        dir.write(
            "20-b.conflist",
            r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"second"}]}"#,
        );
        dir.write(
            "10-a.conflist",
            r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"first"}]}"#,
        );
        dir.write(
            "00-single.conf",
            r#"{"cniVersion":"0.4.0","name":"net","type":"single"}"#,
        );
        dir.write(
            "05-other.json",
            r#"{"cniVersion":"0.4.0","name":"other","type":"single-json"}"#,
        );
        let net = load(&dir.0, "net").unwrap();
        assert_eq!(net.plugins[0].plugin_type, "first");
        assert_eq!(
            net.bytes,
            br#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"first"}]}"#
        );

        let other = load(&dir.0, "other").unwrap();
        assert_eq!(other.cni_version, "0.4.0");
        assert_eq!(other.plugins.len(), 1);
        assert_eq!(other.plugins[0].plugin_type, "single-json");
        assert_eq!(
            String::from_utf8(other.bytes).unwrap(),
            r#"{"cniVersion":"0.4.0","name":"other","plugins":[{"cniVersion":"0.4.0","name":"other","type":"single-json"}]}"#
        );

        assert_eq!(
            load(&dir.0, "nope").unwrap_err().to_string(),
            format!(
                "no net configuration with name \"nope\" in {}",
                dir.0.display()
            )
        );
    }

    #[test]
    fn empty_or_missing_dir_has_no_configs() {
        let dir = Scratch::new("empty");
        let err = load(&dir.0, "x").unwrap_err().to_string();
        assert_eq!(
            err,
            format!("no net configurations found in {}", dir.0.display())
        );
        assert!(matches!(
            load(&dir.0.join("missing"), "x"),
            Err(Error::NoConfigs { .. })
        ));
        // Only conflists, none matching: "not found" rather than "no configs".
        dir.write(
            "a.conflist",
            r#"{"name":"a","cniVersion":"1.0.0","plugins":[{"type":"t"}]}"#,
        );
        assert!(matches!(load(&dir.0, "x"), Err(Error::NotFound { .. })));
    }

    #[test]
    fn a_broken_conflist_fails_the_load_even_for_another_network() {
        let dir = Scratch::new("broken");
        dir.write("a.conflist", "{");
        dir.write(
            "b.conflist",
            r#"{"name":"b","cniVersion":"1.0.0","plugins":[{"type":"t"}]}"#,
        );
        assert!(
            load(&dir.0, "b")
                .unwrap_err()
                .to_string()
                .starts_with("error parsing configuration list:")
        );
    }

    #[test]
    fn plugin_files_in_the_network_directory_are_appended() {
        let dir = Scratch::new("plugindir");
        dir.write("n.conflist", r#"{"name":"n","cniVersion":"1.1.0"}"#);
        dir.write("n/2.conf", r#"{"type":"two"}"#);
        dir.write("n/1.conf", r#"{"type":"one"}"#);
        dir.write("n/ignored.json", r#"{"type":"ignored"}"#);
        let net = load(&dir.0, "n").unwrap();
        let types: Vec<_> = net.plugins.iter().map(|p| p.plugin_type.as_str()).collect();
        assert_eq!(types, ["one", "two"]);

        dir.write(
            "m.conflist",
            r#"{"name":"m","cniVersion":"1.1.0","loadOnlyInlinedPlugins":true,"plugins":[{"type":"inline"}]}"#,
        );
        dir.write("m/1.conf", r#"{"type":"ignored"}"#);
        assert_eq!(load(&dir.0, "m").unwrap().plugins.len(), 1);

        dir.write("e.conflist", r#"{"name":"e","cniVersion":"1.1.0"}"#);
        assert_eq!(
            load(&dir.0, "e").unwrap_err().to_string(),
            "no plugin configs found"
        );
    }

    #[test]
    fn cni_versions_picks_the_highest_supported() {
        let l = list(
            r#"{"name":"n","cniVersion":"0.4.0","cniVersions":["1.0.0","9.9.9","0.3.1"],"plugins":[{"type":"t"}]}"#,
        )
        .unwrap();
        assert_eq!(l.cni_version, "1.0.0");
        let l = list(
            r#"{"name":"n","cniVersion":"1.1.0","cniVersions":["1.0.0"],"plugins":[{"type":"t"}]}"#,
        )
        .unwrap();
        assert_eq!(l.cni_version, "1.1.0");
        let l = list(r#"{"name":"n","cniVersions":["2.0.0"],"plugins":[{"type":"t"}]}"#).unwrap();
        assert_eq!(l.cni_version, "");
        assert_eq!(
            list(r#"{"name":"n","cniVersions":"1.0.0","plugins":[{"type":"t"}]}"#)
                .unwrap_err()
                .to_string(),
            "error parsing configuration list: invalid type for cniVersions: string"
        );
        assert_eq!(
            list(r#"{"name":"n","cniVersions":[1],"plugins":[{"type":"t"}]}"#)
                .unwrap_err()
                .to_string(),
            "error parsing configuration list: invalid type for cniVersions index 0: float64"
        );
    }

    #[test]
    fn list_level_flags_and_errors_as_libcni() {
        let l = list(
            r#"{"name":"n","cniVersion":"1.1.0","disableCheck":"TRUE","disableGC":true,"plugins":[{"type":"t","capabilities":{"portMappings":true,"ips":false}}]}"#,
        )
        .unwrap();
        assert!(l.disable_check && l.disable_gc && !l.load_only_inlined_plugins);
        assert_eq!(l.plugins[0].capabilities.get("portMappings"), Some(&true));
        assert_eq!(l.plugins[0].capabilities.get("ips"), Some(&false));
        for (text, message) in [
            (
                r#"{"plugins":[]}"#,
                "error parsing configuration list: no name",
            ),
            (
                r#"{"name":1}"#,
                "error parsing configuration list: invalid name type float64",
            ),
            (
                r#"{"name":"n","disableCheck":"yes","plugins":[{"type":"t"}]}"#,
                "error parsing configuration list: invalid value \"yes\" for disableCheck",
            ),
            (
                r#"{"name":"n","plugins":{}}"#,
                "error parsing configuration list: invalid 'plugins' type map[string]interface {}",
            ),
            (
                r#"{"name":"n","plugins":[]}"#,
                "error parsing configuration list: no plugins in list",
            ),
            (
                r#"{"name":"n","plugins":[{"name":"x"}]}"#,
                "failed to parse plugin config 0: error parsing configuration: missing 'type'",
            ),
            (
                r#"{"name":"n","loadOnlyInlinedPlugins":true}"#,
                "error parsing configuration list: `loadOnlyInlinedPlugins` is true, and no 'plugins' key",
            ),
        ] {
            assert_eq!(list(text).unwrap_err().to_string(), message, "{text}");
        }
    }

    #[test]
    fn plugin_description_as_libcni() {
        let p =
            PluginConfig::from_value(&serde_json::json!({"type": "bridge", "name": "n"})).unwrap();
        assert_eq!(p.description(), r#"type="bridge" name="n""#);
        let p = PluginConfig::from_value(&serde_json::json!({"type": "bridge"})).unwrap();
        assert_eq!(p.description(), r#"type="bridge""#);
    }
}

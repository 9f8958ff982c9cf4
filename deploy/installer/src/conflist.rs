//! The network config `--conflist` installs: checked before it is written, because a
//! broken file in the conf dir takes the node's pod networking down.

use std::path::Path;

use serde_json::Value;

use crate::InstallError;

/// A config ready to be written into the conf dir.
#[derive(Debug, Clone)]
pub struct Conflist {
    /// Its file name in the conf dir (the name it was given).
    pub file_name: String,
    /// Its contents, unchanged.
    pub bytes: Vec<u8>,
}

/// Reads and checks the config at `path`.
pub fn load(path: &Path) -> Result<Conflist, InstallError> {
    let bytes = std::fs::read(path).map_err(|source| InstallError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |reason: String| InstallError::Conflist {
        path: path.to_path_buf(),
        reason,
    };
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| bad("no file name".to_owned()))?;
    check_name(&file_name).map_err(bad)?;
    check(&bytes).map_err(bad)?;
    Ok(Conflist { file_name, bytes })
}

/// libcni loads only these extensions and skips hidden files.
fn check_name(file_name: &str) -> Result<(), String> {
    let loadable = [".conflist", ".conf", ".json"]
        .iter()
        .any(|ext| file_name.len() > ext.len() && file_name.ends_with(ext));
    if !loadable || file_name.starts_with('.') {
        return Err(format!(
            "{file_name:?}: libcni loads only *.conflist, *.conf and *.json files"
        ));
    }
    Ok(())
}

/// What libcni needs to load the file: a JSON object with a name, and either a
/// non-empty `plugins` list of objects with a `type`, or a `type` itself.
fn check(bytes: &[u8]) -> Result<(), String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    let conf = value
        .as_object()
        .ok_or_else(|| "not a JSON object".to_owned())?;
    let has_text = |obj: &serde_json::Map<String, Value>, key: &str| {
        obj.get(key)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    };
    if !has_text(conf, "name") {
        return Err("missing network name".to_owned());
    }
    match conf.get("plugins") {
        Some(Value::Array(plugins)) if !plugins.is_empty() => {
            for (i, plugin) in plugins.iter().enumerate() {
                if !plugin.as_object().is_some_and(|p| has_text(p, "type")) {
                    return Err(format!("plugins[{i}] has no type"));
                }
            }
            Ok(())
        }
        Some(_) => Err("\"plugins\" must be a non-empty list".to_owned()),
        None if has_text(conf, "type") => Ok(()),
        None => Err("neither \"plugins\" nor \"type\"".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_configs() {
        for text in [
            r#"{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge"},{"type":"loopback"}]}"#,
            r#"{"name":"single","type":"bridge"}"#,
        ] {
            assert_eq!(check(text.as_bytes()), Ok(()), "{text}");
        }
        for name in ["10-k8s.conflist", "99-loopback.conf", "x.json"] {
            assert_eq!(check_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn refused_configs_say_why() {
        for (text, want) in [
            (
                "{",
                "not valid JSON: EOF while parsing an object at line 1 column 1",
            ),
            ("[]", "not a JSON object"),
            (r#"{"plugins":[{"type":"bridge"}]}"#, "missing network name"),
            (r#"{"name":"","type":"bridge"}"#, "missing network name"),
            (
                r#"{"name":"n","plugins":[]}"#,
                "\"plugins\" must be a non-empty list",
            ),
            (
                r#"{"name":"n","plugins":{}}"#,
                "\"plugins\" must be a non-empty list",
            ),
            (
                r#"{"name":"n","plugins":[{"type":"bridge"},{"ipam":{}}]}"#,
                "plugins[1] has no type",
            ),
            (r#"{"name":"n"}"#, "neither \"plugins\" nor \"type\""),
        ] {
            assert_eq!(check(text.as_bytes()), Err(want.to_owned()), "{text}");
        }
        for name in ["net.yaml", ".conflist", ".hidden.conflist", "conflist"] {
            assert!(check_name(name).is_err(), "{name}");
        }
    }
}

//! libcni's result cache, in its own format and place, so that attachments made by a
//! runtime (containerd, CRI-O, Podman) and by cnitool can be checked, deleted and
//! garbage-collected by either.
//!
//! One file per attachment, `<cache dir>/results/<network>-<container id>-<ifname>`
//! (directory 0700, file 0600), holding the JSON of libcni's `cachedInfo`:
//! `kind` (`cniCacheV1`), `containerId`, `config` (the list's bytes, base64 as Go encodes
//! `[]byte`), `ifName`, `networkName`, `netns`, `cniArgs` (`[["K","V"]]`),
//! `capabilityArgs` and `result` (the final ADD result). Older libcni wrote the bare
//! result; that "legacy" form is still read.

use crate::error::Error;
use cni_protocol::CniResult;
use cni_protocol::json::sort_keys;
use serde_json::{Map, Value};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The `kind` of the current cache format.
pub const KIND_V1: &str = "cniCacheV1";

/// libcni's default cache directory.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni";

/// Everything libcni keeps about one attachment.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// `containerId`.
    pub container_id: String,
    /// `config`: the network list's bytes.
    pub config: Vec<u8>,
    /// `ifName`.
    pub ifname: String,
    /// `networkName`.
    pub network: String,
    /// `netns` (absent in entries of libcni before 1.2).
    pub netns: String,
    /// `cniArgs`.
    pub cni_args: Vec<(String, String)>,
    /// `capabilityArgs`.
    pub capability_args: Map<String, Value>,
    /// `result`, as JSON (only the ADD writer fills it; attachment listings leave it out).
    pub result: Option<Value>,
}

impl Entry {
    /// The file's JSON, field for field as Go marshals `cachedInfo`.
    pub fn to_json(&self) -> Vec<u8> {
        let mut obj = Map::new();
        obj.insert("kind".into(), KIND_V1.into());
        obj.insert("containerId".into(), self.container_id.clone().into());
        obj.insert("config".into(), base64(&self.config).into());
        obj.insert("ifName".into(), self.ifname.clone().into());
        obj.insert("networkName".into(), self.network.clone().into());
        if !self.netns.is_empty() {
            obj.insert("netns".into(), self.netns.clone().into());
        }
        if !self.cni_args.is_empty() {
            let pairs = self
                .cni_args
                .iter()
                .map(|(k, v)| Value::Array(vec![k.clone().into(), v.clone().into()]));
            obj.insert("cniArgs".into(), pairs.collect());
        }
        if !self.capability_args.is_empty() {
            // Go marshals a map with its keys sorted.
            obj.insert(
                "capabilityArgs".into(),
                sort_keys(Value::Object(self.capability_args.clone())),
            );
        }
        if let Some(result) = &self.result {
            obj.insert("result".into(), sort_keys(result.clone()));
        }
        serde_json::to_vec(&Value::Object(obj)).unwrap_or_default()
    }

    /// Reads a `cniCacheV1` entry; `None` for anything else (a legacy or foreign file).
    pub fn from_json(bytes: &[u8]) -> Option<Self> {
        let value: Value = serde_json::from_slice(bytes).ok()?;
        let obj = value.as_object()?;
        if obj.get("kind").and_then(Value::as_str) != Some(KIND_V1) {
            return None;
        }
        let text = |key: &str| match obj.get(key) {
            None | Some(Value::Null) => Some(String::new()),
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => None,
        };
        let mut cni_args = Vec::new();
        match obj.get("cniArgs") {
            None | Some(Value::Null) => {}
            Some(Value::Array(pairs)) => {
                for pair in pairs {
                    match pair.as_array().map(Vec::as_slice) {
                        Some([Value::String(k), Value::String(v)]) => {
                            cni_args.push((k.clone(), v.clone()));
                        }
                        _ => return None,
                    }
                }
            }
            Some(_) => return None,
        }
        let capability_args = match obj.get("capabilityArgs") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(map)) => map.clone(),
            Some(_) => return None,
        };
        let config = match text("config")? {
            t if t.is_empty() => Vec::new(),
            t => unbase64(&t)?,
        };
        Some(Self {
            container_id: text("containerId")?,
            config,
            ifname: text("ifName")?,
            network: text("networkName")?,
            netns: text("netns")?,
            cni_args,
            capability_args,
            result: obj.get("result").filter(|v| !v.is_null()).cloned(),
        })
    }
}

/// Whether the parts of a cache file name are what libcni accepts on its command line
/// (a network name and container ID of letters, digits, `_`, `.` and `-`, starting with
/// a letter or digit; an interface name the kernel would take): a cache entry is a
/// file anyone with write access to the cache dir may have planted, and its fields
/// become a path.
pub fn valid_parts(network: &str, container_id: &str, ifname: &str) -> Result<(), Error> {
    use cni_protocol::env::{is_valid_identifier, validate_container_id, validate_ifname};
    let refused = |part, value: &str, source| Error::CacheName {
        part,
        value: value.to_string(),
        source,
    };
    if !is_valid_identifier(network) {
        return Err(refused("network name", network, None));
    }
    validate_container_id(container_id)
        .map_err(|e| refused("container ID", container_id, Some(e)))?;
    validate_ifname(ifname).map_err(|e| refused("interface name", ifname, Some(e)))
}

/// The cache file of one attachment; libcni refuses to name one with an empty part,
/// and none is named from parts [`valid_parts`] refuses.
pub fn file_path(
    cache_dir: &Path,
    network: &str,
    container_id: &str,
    ifname: &str,
) -> Result<PathBuf, Error> {
    if network.is_empty() || container_id.is_empty() || ifname.is_empty() {
        return Err(Error::CachePath {
            network: network.to_string(),
            container_id: container_id.to_string(),
            ifname: ifname.to_string(),
        });
    }
    valid_parts(network, container_id, ifname)?;
    Ok(cache_dir
        .join("results")
        .join(format!("{network}-{container_id}-{ifname}")))
}

/// Writes an attachment's entry (after a successful ADD).
pub fn write(cache_dir: &Path, entry: &Entry) -> Result<(), Error> {
    let path = file_path(
        cache_dir,
        &entry.network,
        &entry.container_id,
        &entry.ifname,
    )?;
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| Error::CacheIo {
                op: "mkdir",
                path: dir.to_path_buf(),
                source,
            })?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(|source| Error::CacheIo {
            op: "open",
            path: path.clone(),
            source,
        })?;
    file.write_all(&entry.to_json())
        .map_err(|source| Error::CacheIo {
            op: "write",
            path,
            source,
        })
}

/// The cached result of an attachment, converted to `version` (what plugins get as
/// `prevResult` for CHECK and DEL). `Ok(None)` when there is no readable cache file.
pub fn read_result(
    cache_dir: &Path,
    network: &str,
    container_id: &str,
    ifname: &str,
    version: &str,
) -> Result<Option<Value>, Error> {
    let path = file_path(cache_dir, network, container_id, ifname)?;
    // A missing or unreadable file is no cached result, as in libcni.
    let Ok(bytes) = std::fs::read(&path) else {
        return Ok(None);
    };
    cached_result(&bytes, version).map(Some)
}

/// The result held by a cache file's bytes (a `cniCacheV1` entry or, as before it, the
/// bare result), converted to `version`.
pub fn cached_result(bytes: &[u8], version: &str) -> Result<Value, Error> {
    let raw = match Entry::from_json(bytes) {
        Some(entry) => entry.result.unwrap_or(Value::Null),
        // Before cniCacheV1 the file held the bare result.
        None => serde_json::from_slice(bytes).map_err(Error::CacheJson)?,
    };
    let result = CniResult::parse(&raw, "0.1.0").map_err(Error::CacheResult)?;
    let text = result
        .to_json(version)
        .map_err(|source| Error::CacheConvert {
            version: version.to_string(),
            source,
        })?;
    serde_json::from_str(&text).map_err(Error::CacheJson)
}

/// Removes an attachment's entry; a missing one is not an error.
pub fn remove(cache_dir: &Path, network: &str, container_id: &str, ifname: &str) {
    if let Ok(path) = file_path(cache_dir, network, container_id, ifname) {
        // libcni ignores this error too: DEL has succeeded by now.
        let _ = std::fs::remove_file(path);
    }
}

/// Every `cniCacheV1` attachment in the cache, in file name order (libcni's
/// `GetCachedAttachments("")`); entries without a network or interface are skipped.
pub fn attachments(cache_dir: &Path) -> std::io::Result<Vec<Entry>> {
    let dir = cache_dir.join("results");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    names.sort();
    Ok(names
        .iter()
        .filter_map(|path| Some((path, std::fs::read(path).ok()?)))
        .filter_map(|(path, bytes)| match listed_entry(&bytes)? {
            Ok(entry) => Some(entry),
            Err(why) => {
                eprintln!("cnitool: skipping cache entry {}: {why}", path.display());
                None
            }
        })
        .collect())
}

/// One cache file's bytes as [`attachments`] lists them: `None` for a file that is not
/// a `cniCacheV1` entry of a network and interface (skipped silently, as libcni does),
/// an error for an entry whose parts [`valid_parts`] refuses (reported, then skipped),
/// else the entry without its result.
pub fn listed_entry(bytes: &[u8]) -> Option<Result<Entry, Error>> {
    let entry = Entry::from_json(bytes)?;
    if entry.ifname.is_empty() || entry.network.is_empty() {
        return None;
    }
    Some(
        valid_parts(&entry.network, &entry.container_id, &entry.ifname).map(|()| Entry {
            result: None,
            ..entry
        }),
    )
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding, as Go's encoding/json writes a `[]byte`.
fn base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The inverse of [`base64`]; `None` for text Go's decoder would refuse.
fn unbase64(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (index, chunk) in bytes.chunks(4).enumerate() {
        let last = index + 1 == bytes.len() / 4;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            let v = ALPHABET.iter().position(|&a| a == c)?;
            n = (n << 6) | u32::try_from(v).ok()?;
        }
        n <<= 6 * pad;
        let decoded = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&decoded[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn base64_round_trips_and_matches_go() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("{\"a\":1}\n", "eyJhIjoxfQo="),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
            assert_eq!(unbase64(encoded).unwrap(), plain.as_bytes());
        }
        assert_eq!(unbase64("Zg="), None);
        assert_eq!(unbase64("Zg==Zg=="), None);
        assert_eq!(unbase64("Z!=="), None);
    }

    fn entry() -> Entry {
        let mut caps = Map::new();
        caps.insert("portMappings".into(), json!([{"hostPort": 8080}]));
        Entry {
            container_id: "cnitool-7b8a61d5d8e94d07cbe4".into(),
            config: br#"{"name":"n"}"#.to_vec(),
            ifname: "eth0".into(),
            network: "n".into(),
            netns: "/var/run/netns/test".into(),
            cni_args: vec![("K8S_POD_NAME".into(), "p".into())],
            capability_args: caps,
            result: Some(json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]})),
        }
    }

    #[test]
    fn entry_json_is_libcnis_cached_info() {
        let text = String::from_utf8(entry().to_json()).unwrap();
        assert_eq!(
            text,
            concat!(
                r#"{"kind":"cniCacheV1","containerId":"cnitool-7b8a61d5d8e94d07cbe4","#,
                r#""config":"eyJuYW1lIjoibiJ9","ifName":"eth0","networkName":"n","#,
                r#""netns":"/var/run/netns/test","cniArgs":[["K8S_POD_NAME","p"]],"#,
                r#""capabilityArgs":{"portMappings":[{"hostPort":8080}]},"#,
                r#""result":{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}]}}"#
            )
        );
        assert_eq!(Entry::from_json(text.as_bytes()).unwrap(), entry());
        // Empty optional fields are left out, as Go's omitempty does.
        let bare = Entry {
            netns: String::new(),
            cni_args: vec![],
            capability_args: Map::new(),
            result: None,
            ..entry()
        };
        let text = String::from_utf8(bare.to_json()).unwrap();
        assert!(!text.contains("netns") && !text.contains("cniArgs"));
        assert!(!text.contains("capabilityArgs") && !text.contains("result"));
    }

    #[test]
    fn reads_an_entry_written_by_libcni() {
        // A file as libcni 1.1.2 (containerd) writes it: no netns, Go's field order.
        let file = br#"{"kind":"cniCacheV1","containerId":"abc","config":"e30=","ifName":"eth0","networkName":"net","cniArgs":[["IgnoreUnknown","1"]],"result":{"cniVersion":"0.4.0","dns":{},"interfaces":[{"mac":"aa:bb:cc:dd:ee:ff","name":"eth0","sandbox":"/p"}],"ips":[{"address":"10.1.0.5/24","gateway":"10.1.0.1","interface":0,"version":"4"}]}}"#;
        let e = Entry::from_json(file).unwrap();
        assert_eq!(e.container_id, "abc");
        assert_eq!(e.config, b"{}");
        assert_eq!(e.cni_args, [("IgnoreUnknown".into(), "1".into())]);
        assert!(e.netns.is_empty());
        assert_eq!(Entry::from_json(br#"{"kind":"other"}"#), None);
        assert_eq!(Entry::from_json(b"[]"), None);
    }

    /// Found by the `cnitool_cache` fuzz target: a large number (here a host port in
    /// capabilityArgs, as anyone may plant or a runtime may pass) changed by one unit in
    /// the last place each time an entry was read, so cnitool rewrote a cached entry
    /// with other numbers than libcni wrote.
    #[test]
    fn an_entry_reads_back_with_its_numbers_unchanged() {
        let file = br#"{"kind":"cniCacheV1","containerId":"c","config":"","ifName":"eth0","networkName":"n","capabilityArgs":{"portMappings":[{"containerPort":80,"hostPort":80800000000000000000000000000000000000000000000}]},"result":{"cniVersion":"1.1.0","ips":[{"address":"10.22.0.7/16","interface":1111111111111111111111}]}}"#;
        let e = Entry::from_json(file).unwrap();
        let port = &e.capability_args["portMappings"][0]["hostPort"];
        assert_eq!(port.as_f64(), Some(8.08e46));
        let again = Entry::from_json(&e.to_json()).unwrap();
        assert_eq!(again, e);
        let text = String::from_utf8(e.to_json()).unwrap();
        assert!(text.contains(r#""hostPort":8.08e+46"#), "{text}");
    }

    #[test]
    fn a_listed_entry_is_valid_or_reported_and_other_files_are_skipped() {
        let listed = listed_entry(&entry().to_json()).unwrap().unwrap();
        assert_eq!(
            listed,
            Entry {
                result: None,
                ..entry()
            }
        );
        let planted = Entry {
            container_id: "../../etc".into(),
            ..entry()
        };
        let why = listed_entry(&planted.to_json())
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(
            why.starts_with("invalid container ID \"../../etc\": "),
            "{why}"
        );
        let no_ifname = Entry {
            ifname: String::new(),
            ..entry()
        };
        assert!(listed_entry(&no_ifname.to_json()).is_none());
        assert!(listed_entry(br#"{"cniVersion":"0.3.1"}"#).is_none());
        assert!(listed_entry(b"\xff").is_none());
    }

    #[test]
    fn cache_file_lifecycle_and_version_conversion() {
        let dir = std::env::temp_dir().join(format!("cnitool-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let e = entry();
        write(&dir, &e).unwrap();
        let path = dir.join("results/n-cnitool-7b8a61d5d8e94d07cbe4-eth0");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let dir_mode = std::fs::metadata(dir.join("results"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);

        let as_040 = read_result(&dir, "n", &e.container_id, "eth0", "0.4.0")
            .unwrap()
            .unwrap();
        assert_eq!(as_040["cniVersion"], "0.4.0");
        assert_eq!(as_040["ips"][0]["version"], "4");
        let listed = attachments(&dir).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].network, "n");
        assert_eq!(listed[0].result, None);

        // The legacy form (a bare result) is read too.
        std::fs::write(
            &path,
            br#"{"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.0.0.9/24"}]}"#,
        )
        .unwrap();
        let legacy = read_result(&dir, "n", &e.container_id, "eth0", "1.0.0")
            .unwrap()
            .unwrap();
        assert_eq!(legacy["ips"][0]["address"], "10.0.0.9/24");
        assert!(attachments(&dir).unwrap().is_empty());

        remove(&dir, "n", &e.container_id, "eth0");
        assert!(!path.exists());
        assert_eq!(
            read_result(&dir, "n", &e.container_id, "eth0", "1.0.0").unwrap(),
            None
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(file_path(&dir, "", "id", "eth0").is_err());
    }
}

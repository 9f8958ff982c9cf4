//! This node's WireGuard private key: made once from the system's random source, kept
//! in a root-only file of the state directory (`0600` in a `0700` directory), written
//! atomically, and read again at every start, so a restart or an upgrade keeps the key
//! the other nodes know. `cni-node rotate-key` replaces it ([`rotate`]); the agent
//! hears the file change and publishes the new public key.
//!
//! The file holds the key in base64 and a newline, as `wg genkey` prints one, so `wg
//! pubkey < /var/lib/cni-node/wireguard.key` shows what the Node annotation should say.

use std::fs::{self, DirBuilder, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::error::{Error, Result};

/// The key file's name in the state directory.
pub const FILE_NAME: &str = "wireguard.key";

/// A WireGuard key (private or public): 32 bytes, written as `wg` writes them.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(pub [u8; 32]);

impl Key {
    /// The base64 text of the key (44 characters).
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }

    /// A key from its base64 text, or why it is not one.
    pub fn from_base64(text: &str) -> std::result::Result<Self, String> {
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|e| format!("not base64: {e}"))?;
        let bytes: [u8; 32] = bytes
            .try_into()
            .map_err(|b: Vec<u8>| format!("{} bytes, a key has 32", b.len()))?;
        Ok(Self(bytes))
    }

    /// The public key of this private key.
    pub fn public(&self) -> Self {
        let secret = x25519_dalek::StaticSecret::from(self.0);
        Self(x25519_dalek::PublicKey::from(&secret).to_bytes())
    }

    /// A new private key from the system's random source.
    pub fn generate() -> io::Result<Self> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| io::Error::other(e.to_string()))?;
        // Clamped as `wg genkey` clamps, so the file reads the same to `wg`.
        bytes[0] &= 248;
        bytes[31] &= 127;
        bytes[31] |= 64;
        Ok(Self(bytes))
    }
}

/// Public keys are shown whole (they are published); a private key never is.
impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({}...)", &self.to_base64()[..8])
    }
}

/// The key file of a state directory.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE_NAME)
}

/// The private key in `state_dir`, made first when there is none; `true` when it was
/// made now. The directory is made root-only (`0700`), the file is `0600`.
pub fn load_or_create(state_dir: &Path) -> Result<(Key, bool)> {
    let file = path(state_dir);
    match read(&file)? {
        Some(key) => {
            root_only(state_dir)?;
            Ok((key, false))
        }
        None => Ok((write_new(state_dir)?, true)),
    }
}

/// What changes whenever the key file is written or replaced: its device, inode,
/// size, and modification and change times (a writer can set the first time back, not
/// the second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

/// The key file's [`Stamp`], `None` when there is no file.
fn stamp(file: &Path) -> Result<Option<Stamp>> {
    use std::os::unix::fs::MetadataExt;
    match fs::metadata(file) {
        Ok(m) => Ok(Some(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            modified: (m.mtime(), m.mtime_nsec()),
            changed: (m.ctime(), m.ctime_nsec()),
        })),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::KeyFile {
            action: "read",
            path: file.to_owned(),
            source,
        }),
    }
}

/// This node's key as last read from its file, read again (and its public key derived
/// again) only when the file changed: the reconciler asks for it on every pass, and
/// deriving a public key is a curve multiplication, which is not free on a slow host.
#[derive(Default)]
pub struct KeyCache {
    loaded: Option<(Stamp, Key, Key)>,
    reads: u64,
}

/// Never shows the private key.
impl std::fmt::Debug for KeyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyCache")
            .field("public", &self.loaded.as_ref().map(|(_, _, public)| public))
            .field("reads", &self.reads)
            .finish()
    }
}

impl KeyCache {
    /// The private key in `state_dir` and its public key, made first when there is
    /// none (`true` then), read from the file only when it changed since the last call.
    pub fn load(&mut self, state_dir: &Path) -> Result<(Key, Key, bool)> {
        let file = path(state_dir);
        // Taken before the read: a file replaced between the two is read again next
        // time, never taken for the one read now.
        let before = stamp(&file)?;
        if let (Some(now), Some((then, private, public))) = (before, &self.loaded)
            && now == *then
        {
            return Ok((*private, *public, false));
        }
        let (private, made) = load_or_create(state_dir)?;
        self.reads += 1;
        let public = match &self.loaded {
            Some((_, p, public)) if *p == private => *public,
            _ => private.public(),
        };
        let stamp = if made { stamp(&file)? } else { before };
        self.loaded = stamp.map(|s| (s, private, public));
        Ok((private, public, made))
    }

    /// How many times the file was read.
    pub fn reads(&self) -> u64 {
        self.reads
    }
}

/// The key in `file`, `None` when there is no file.
pub fn read(file: &Path) -> Result<Option<Key>> {
    let text = match fs::read(file) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::KeyFile {
                action: "read",
                path: file.to_owned(),
                source,
            });
        }
    };
    let bad = |why: String| Error::BadKeyFile {
        path: file.to_owned(),
        why,
    };
    let text = std::str::from_utf8(&text).map_err(|_| bad("not text".to_owned()))?;
    Key::from_base64(text).map(Some).map_err(bad)
}

/// Makes `state_dir` root-only if it is not (a hostPath the kubelet made is `0755`).
fn root_only(state_dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let fail = |source| Error::KeyFile {
        action: "protect",
        path: path(state_dir),
        source,
    };
    let mode = fs::metadata(state_dir).map_err(fail)?.mode();
    if mode & 0o077 != 0 {
        fs::set_permissions(state_dir, Permissions::from_mode(0o700)).map_err(fail)?;
    }
    Ok(())
}

/// Writes a new private key into `state_dir` (made `0700` first), atomically, `0600`.
pub fn write_new(state_dir: &Path) -> Result<Key> {
    let fail = |action, source| Error::KeyFile {
        action,
        path: path(state_dir),
        source,
    };
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .map_err(|e| fail("create", e))?;
    // A directory made by someone else, or before: root-only all the same.
    fs::set_permissions(state_dir, Permissions::from_mode(0o700)).map_err(|e| fail("create", e))?;
    let key = Key::generate().map_err(|e| fail("create", e))?;
    let mut text = key.to_base64();
    text.push('\n');
    cni_atomic_file::write(state_dir, FILE_NAME, text.as_bytes(), 0o600)
        .map_err(|e| fail("write", e))?;
    Ok(key)
}

/// `cni-node rotate-key`: a new private key replaces the old one in `state_dir`; the
/// running agent hears the change, puts the key on its device and publishes the new
/// public key. Returns the new public key.
pub fn rotate(state_dir: &Path) -> Result<Key> {
    write_new(state_dir).map(|k| k.public())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn temp_dir(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "cni-node-key-{name}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ))
    }

    struct Removed(PathBuf);
    impl Drop for Removed {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_key_is_made_once_root_only_and_reused() {
        let dir = temp_dir("once").join("state");
        let _guard = Removed(dir.parent().unwrap().to_owned());
        let (key, made) = load_or_create(&dir).unwrap();
        assert!(made);
        let meta = fs::metadata(path(&dir)).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        let text = fs::read_to_string(path(&dir)).unwrap();
        assert_eq!(text.len(), 45, "{text:?}");
        assert!(text.ends_with('\n'));
        // Read again: the same key, nothing made.
        let (again, made) = load_or_create(&dir).unwrap();
        assert!(!made);
        assert_eq!(again, key);
        // No temp file left beside it.
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [FILE_NAME]);
    }

    #[test]
    fn a_wider_directory_is_made_root_only() {
        let dir = temp_dir("wide");
        let _guard = Removed(dir.clone());
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
        load_or_create(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        // Opened wide again after the key was made: made root-only at the next read.
        fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
        load_or_create(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    }

    #[test]
    fn rotation_replaces_the_key_and_returns_the_new_public_key() {
        let dir = temp_dir("rotate");
        let _guard = Removed(dir.clone());
        let (old, _) = load_or_create(&dir).unwrap();
        let public = rotate(&dir).unwrap();
        let (new, made) = load_or_create(&dir).unwrap();
        assert!(!made);
        assert_ne!(new, old);
        assert_eq!(new.public(), public);
        assert_eq!(
            fs::metadata(path(&dir)).unwrap().mode() & 0o777,
            0o600,
            "the replaced file is root-only too"
        );
    }

    #[test]
    fn a_corrupt_file_is_a_clear_error_and_is_not_replaced() {
        let dir = temp_dir("corrupt");
        let _guard = Removed(dir.clone());
        fs::create_dir_all(&dir).unwrap();
        for (contents, why) in [
            (&b"not a key\n"[..], "not base64"),
            (&b"AAAA\n"[..], "3 bytes, a key has 32"),
            (&[0xff, 0xfe][..], "not text"),
        ] {
            fs::write(path(&dir), contents).unwrap();
            let e = load_or_create(&dir).unwrap_err();
            let text = crate::error::chain(&e);
            assert!(
                text.contains(why) && text.contains("wireguard.key"),
                "{text}"
            );
            assert_eq!(fs::read(path(&dir)).unwrap(), contents, "left as it was");
        }
    }

    #[test]
    fn the_cache_reads_the_file_only_when_it_changed() {
        let dir = temp_dir("cache");
        let _guard = Removed(dir.clone());
        let mut cache = KeyCache::default();
        let (private, public, made) = cache.load(&dir).unwrap();
        assert!(made);
        assert_eq!(public, private.public());
        for _ in 0..3 {
            assert_eq!(cache.load(&dir).unwrap(), (private, public, false));
        }
        assert_eq!(cache.reads(), 1, "an unchanged file is not read again");
        // Replaced (a rotation), then written in place: each is seen.
        let rotated = rotate(&dir).unwrap();
        assert_eq!(cache.load(&dir).unwrap().1, rotated);
        assert_eq!(cache.reads(), 2);
        fs::write(path(&dir), "not a key\n").unwrap();
        assert!(cache.load(&dir).is_err(), "a corrupt file is an error");
    }

    /// RFC 7748's test vector: Alice's private key gives her public key.
    #[test]
    fn the_public_key_is_x25519s() {
        let hex = |s: &str| -> [u8; 32] {
            let v: Vec<u8> = (0..32)
                .map(|i| u8::from_str_radix(&s[i * 2..i * 2 + 2], 16).unwrap())
                .collect();
            v.try_into().unwrap()
        };
        let private = Key(hex(
            "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
        ));
        assert_eq!(
            private.public(),
            Key(hex(
                "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
            ))
        );
        assert_eq!(Key::from_base64(&private.to_base64()), Ok(private));
        let generated = Key::generate().unwrap();
        assert_ne!(generated, Key::generate().unwrap());
        assert_eq!(generated.0[0] & 7, 0);
        assert_eq!(generated.0[31] & 0xc0, 0x40);
    }
}

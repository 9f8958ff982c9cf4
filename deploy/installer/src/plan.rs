//! What to do with one binary, decided from its bytes and those of the file it would
//! replace. Pure: the caller reads the files and does the writing.

use cni_build_stamp::Stamp;

/// The binaries installed, by file name.
pub const PLUGINS: [&str; 5] = ["bridge", "host-local", "loopback", "portmap", "bandwidth"];

/// What an installed file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Existing {
    /// A cni-plugins-rs binary with this stamp.
    Ours(Stamp),
    /// Anything else: a reference Go plugin, another project's, a broken file.
    NotOurs,
}

/// The decision for one binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing is installed under that name.
    Install,
    /// The installed file is byte for byte the new one.
    Unchanged,
    /// A different file is installed (for ours, whether it is newer is
    /// [`is_downgrade`]'s question).
    Replace(Existing),
}

/// Decides for the binary `new` given the installed file's bytes.
pub fn decide(new: &[u8], installed: Option<&[u8]>) -> Action {
    match installed {
        None => Action::Install,
        Some(old) if old == new => Action::Unchanged,
        Some(old) => Action::Replace(match Stamp::find(old) {
            Some(old) => Existing::Ours(old),
            None => Existing::NotOurs,
        }),
    }
}

/// Whether replacing `installed` by `new` goes back to an older version. The same
/// version with another commit is not a downgrade (a rebuild, or a fix on a branch).
pub fn is_downgrade(installed: &Stamp, new: &Stamp) -> bool {
    installed.version > new.version
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_build_stamp::Version;

    fn stamp(version: &str, commit: &str) -> Stamp {
        Stamp {
            version: Version::parse(version).unwrap(),
            commit: commit.to_owned(),
        }
    }

    fn binary(version: &str, commit: &str) -> Vec<u8> {
        format!(
            "\x7fELF...CNI bridge plugin v{version} (cni-plugins-rs, commit {commit}; not the Go reference plugins)..."
        )
        .into_bytes()
    }

    #[test]
    fn decisions() {
        let new = binary("0.2.0", "bbbbbbb");
        assert_eq!(decide(&new, None), Action::Install);
        assert_eq!(decide(&new, Some(&new)), Action::Unchanged);
        assert_eq!(
            decide(&new, Some(b"\x7fELF Go build ID CNI bridge plugin v1.1.1")),
            Action::Replace(Existing::NotOurs)
        );
        assert_eq!(decide(&new, Some(b"")), Action::Replace(Existing::NotOurs));
        assert_eq!(
            decide(&new, Some(&binary("0.1.0", "aaaaaaa"))),
            Action::Replace(Existing::Ours(stamp("0.1.0", "aaaaaaa")))
        );
    }

    #[test]
    fn downgrade_is_by_version_only() {
        let new = stamp("0.2.0", "bbbbbbb");
        assert!(is_downgrade(&stamp("0.3.0", "x"), &new));
        assert!(is_downgrade(&stamp("0.2.1-rc.1", "x"), &new));
        assert!(!is_downgrade(&stamp("0.2.0", "other"), &new));
        assert!(!is_downgrade(&stamp("0.2.0-rc.1", "x"), &new));
        assert!(!is_downgrade(&stamp("0.1.9", "x"), &new));
    }
}

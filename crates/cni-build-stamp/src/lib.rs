//! The build stamp of cni-plugins-rs: the version and git commit compiled into every
//! binary, the about line that shows them (printed by a plugin run without
//! `CNI_COMMAND`), and [`Stamp::find`], which reads them back out of an installed
//! binary's bytes without running it (the installer uses it to refuse silent
//! downgrades and to tell our binaries from the Go reference plugins).
//!
//! The stamp text is one compile-time string, so it lies in the binary contiguously:
//! `" v0.1.0 (cni-plugins-rs, commit abc1234; not the Go reference plugins)"`.
//! Its leading space keeps the reader from running into whatever bytes precede it.

mod version;

pub use version::{Version, VersionError};

/// The workspace version, as in Cargo.toml.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The short git commit the binary was built from, or "unknown" (see build.rs).
pub const COMMIT: &str = env!("CNI_PLUGINS_RS_COMMIT");

/// The stamp, as it appears in the about line after the program's name.
pub const STAMP: &str = concat!(
    " v",
    env!("CARGO_PKG_VERSION"),
    " (cni-plugins-rs, commit ",
    env!("CNI_PLUGINS_RS_COMMIT"),
    "; not the Go reference plugins)"
);

/// What follows the version in a stamp, up to the commit.
const MIDDLE: &[u8] = b" (cni-plugins-rs, commit ";
/// What closes a stamp after the commit.
const END: &[u8] = b"; not the Go reference plugins)";

/// The about line of a plugin, e.g.
/// `CNI bridge plugin v0.1.0 (cni-plugins-rs, commit abc1234; not the Go reference plugins)`.
/// The reference prints `CNI bridge plugin v1.1.1`: tools that read the first words
/// still see plugin name and version.
pub fn about(plugin: &str) -> String {
    format!("CNI {plugin} plugin{STAMP}")
}

/// A version and commit read back from a binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// The version after the `v`.
    pub version: Version,
    /// The commit, as stamped ("unknown" when built without git).
    pub commit: String,
}

impl Stamp {
    /// The stamp of this build.
    pub fn current() -> Self {
        Self {
            version: Version::parse(VERSION).unwrap_or_default(),
            commit: COMMIT.to_owned(),
        }
    }

    /// Finds the first well-formed stamp in `bytes` (a binary's contents or an about
    /// line); None for anything else, e.g. a reference Go plugin.
    pub fn find(bytes: &[u8]) -> Option<Self> {
        let mut from = 0;
        while let Some(at) = find_from(bytes, MIDDLE, from) {
            if let Some(stamp) = Self::parse_at(bytes, at) {
                return Some(stamp);
            }
            from = at + 1;
        }
        None
    }

    /// Parses the stamp whose [`MIDDLE`] starts at `at`: the version runs back to `" v"`,
    /// the commit forward to [`END`].
    fn parse_at(bytes: &[u8], at: usize) -> Option<Self> {
        let before = &bytes[..at];
        let start = before
            .iter()
            .rposition(|b| !is_version_byte(*b))
            .map_or(0, |p| p + 1);
        // The version token is "v<version>" and follows a space.
        let token = &before[start..];
        if start == 0 || before[start - 1] != b' ' {
            return None;
        }
        let version = std::str::from_utf8(token.strip_prefix(b"v")?).ok()?;
        let version = Version::parse(version).ok()?;
        let rest = &bytes[at + MIDDLE.len()..];
        let len = rest.iter().position(|b| !is_commit_byte(*b))?;
        if len == 0 || !rest[len..].starts_with(END) {
            return None;
        }
        let commit = std::str::from_utf8(&rest[..len]).ok()?.to_owned();
        Some(Self { version, commit })
    }
}

impl std::fmt::Display for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{} (commit {})", self.version, self.commit)
    }
}

fn is_version_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+')
}

fn is_commit_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-')
}

fn find_from(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn about_line_names_plugin_version_commit_and_origin() {
        let line = about("bridge");
        assert_eq!(
            line,
            format!(
                "CNI bridge plugin v{VERSION} (cni-plugins-rs, commit {COMMIT}; not the Go reference plugins)"
            )
        );
        assert!(!COMMIT.is_empty());
    }

    #[test]
    fn the_stamp_is_found_in_our_about_line() {
        assert_eq!(
            Stamp::find(about("host-local").as_bytes()),
            Some(Stamp::current())
        );
    }

    #[test]
    fn the_stamp_is_found_between_other_bytes() {
        let mut blob = b"\x7fELF\0\0garbage-v9.9.9".to_vec();
        blob.extend_from_slice(
            b"xx v1.2.3-rc.1 (cni-plugins-rs, commit 0badc0de; not the Go reference plugins)",
        );
        blob.extend_from_slice(b"more\0");
        let stamp = Stamp::find(&blob).unwrap();
        assert_eq!(stamp.version, Version::parse("1.2.3-rc.1").unwrap());
        assert_eq!(stamp.commit, "0badc0de");
        assert_eq!(stamp.to_string(), "v1.2.3-rc.1 (commit 0badc0de)");
    }

    #[test]
    fn malformed_stamps_are_skipped_for_a_later_good_one() {
        let blob = b"\
            v1.0.0 (cni-plugins-rs, commit abc; not the Go reference plugins)\
            |x1.0.0 (cni-plugins-rs, commit abc; not the Go reference plugins)\
            | v1.0 (cni-plugins-rs, commit abc; not the Go reference plugins)\
            | v1.0.0 (cni-plugins-rs, commit ; not the Go reference plugins)\
            | v1.0.0 (cni-plugins-rs, commit abc; not the reference)\
            | v2.0.0 (cni-plugins-rs, commit def; not the Go reference plugins)";
        let stamp = Stamp::find(blob).unwrap();
        assert_eq!(
            (stamp.version.to_string(), stamp.commit.as_str()),
            ("2.0.0".to_owned(), "def")
        );
    }

    #[test]
    fn reference_about_lines_and_empty_input_have_no_stamp() {
        for text in [
            &b"CNI bridge plugin v1.1.1\nCNI protocol versions supported: 0.1.0"[..],
            b"",
            b" (cni-plugins-rs, commit ",
            b"v (cni-plugins-rs, commit x; not the Go reference plugins)",
        ] {
            assert_eq!(Stamp::find(text), None, "{}", String::from_utf8_lossy(text));
        }
    }
}

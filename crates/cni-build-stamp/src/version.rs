//! Semantic versions (semver 2.0.0): parsing and precedence, for the installer's
//! "is this a downgrade?" question.

use std::cmp::Ordering;
use std::fmt;

/// `MAJOR.MINOR.PATCH[-PRE][+BUILD]`. Build metadata is kept for display but, as semver
/// says, plays no part in precedence.
#[derive(Debug, Clone, Default)]
pub struct Version {
    major: u64,
    minor: u64,
    patch: u64,
    pre: Vec<Identifier>,
    build: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Identifier {
    Numeric(u64),
    Alpha(String),
}

/// Why a text is not a semantic version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionError(String);

impl fmt::Display for VersionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a semantic version (MAJOR.MINOR.PATCH)",
            self.0
        )
    }
}

impl std::error::Error for VersionError {}

impl Version {
    /// Parses `1.2.3`, `1.2.3-rc.1`, `1.2.3+build.5`.
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        let err = || VersionError(text.to_owned());
        let (rest, build) = match text.split_once('+') {
            Some((rest, build)) => {
                if !build.split('.').all(valid_identifier) {
                    return Err(err());
                }
                (rest, build.to_owned())
            }
            None => (text, String::new()),
        };
        let (core, pre) = match rest.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (rest, None),
        };
        let numbers: Vec<u64> = core
            .split('.')
            .map(|n| numeric(n).ok_or_else(err))
            .collect::<Result<_, _>>()?;
        let [major, minor, patch] = numbers[..] else {
            return Err(err());
        };
        let pre = match pre {
            None => Vec::new(),
            Some(pre) => pre
                .split('.')
                .map(|id| {
                    if !valid_identifier(id) {
                        return Err(err());
                    }
                    if id.bytes().all(|b| b.is_ascii_digit()) {
                        numeric(id).map(Identifier::Numeric).ok_or_else(err)
                    } else {
                        Ok(Identifier::Alpha(id.to_owned()))
                    }
                })
                .collect::<Result<_, _>>()?,
        };
        Ok(Self {
            major,
            minor,
            patch,
            pre,
            build,
        })
    }
}

/// A numeric field: digits, no leading zero (except "0" itself).
fn numeric(text: &str) -> Option<u64> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    if !digits || (text.len() > 1 && text.starts_with('0')) {
        return None;
    }
    text.parse().ok()
}

fn valid_identifier(id: &str) -> bool {
    !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                // A pre-release comes before its release.
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => cmp_pre(&self.pre, &other.pre),
            })
    }
}

fn cmp_pre(a: &[Identifier], b: &[Identifier]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let order = match (x, y) {
            (Identifier::Numeric(x), Identifier::Numeric(y)) => x.cmp(y),
            (Identifier::Numeric(_), Identifier::Alpha(_)) => Ordering::Less,
            (Identifier::Alpha(_), Identifier::Numeric(_)) => Ordering::Greater,
            (Identifier::Alpha(x), Identifier::Alpha(y)) => x.cmp(y),
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    a.len().cmp(&b.len())
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Version {}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        for (i, id) in self.pre.iter().enumerate() {
            f.write_str(if i == 0 { "-" } else { "." })?;
            match id {
                Identifier::Numeric(n) => write!(f, "{n}")?,
                Identifier::Alpha(s) => f.write_str(s)?,
            }
        }
        if !self.build.is_empty() {
            write!(f, "+{}", self.build)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap()
    }

    #[test]
    fn semver_precedence_example_chain() {
        // The chain from semver 2.0.0, section 11, plus plain numeric ordering.
        let chain = [
            "0.0.9",
            "0.1.0",
            "0.9.0",
            "0.10.0",
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "1.0.1",
            "1.1.0",
            "2.0.0",
            "10.0.0",
        ];
        for pair in chain.windows(2) {
            assert!(v(pair[0]) < v(pair[1]), "{} < {}", pair[0], pair[1]);
            assert!(v(pair[1]) > v(pair[0]), "{} > {}", pair[1], pair[0]);
        }
    }

    #[test]
    fn build_metadata_does_not_order() {
        assert_eq!(v("1.0.0+a"), v("1.0.0+b"));
        assert_eq!(v("1.0.0+a").to_string(), "1.0.0+a");
    }

    #[test]
    fn display_round_trips() {
        for text in ["0.1.0", "1.2.3-rc.1", "1.2.3-0.x-y.7+build.5"] {
            assert_eq!(v(text).to_string(), text);
        }
    }

    #[test]
    fn malformed_versions_are_refused() {
        for text in [
            "",
            "1",
            "1.2",
            "1.2.3.4",
            "01.2.3",
            "1.02.3",
            "1.2.3-",
            "1.2.3-a..b",
            "1.2.3-01",
            "1.2.3+",
            "a.b.c",
            "1.2.3-ä",
            "v1.2.3",
            "99999999999999999999.0.0",
        ] {
            assert!(Version::parse(text).is_err(), "{text:?} accepted");
        }
        assert_eq!(
            Version::parse("1.2").unwrap_err().to_string(),
            "\"1.2\" is not a semantic version (MAJOR.MINOR.PATCH)"
        );
    }
}

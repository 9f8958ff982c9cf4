//! Kernel parameters under `/proc/sys`. Names are slash-separated paths
//! relative to `/proc/sys` (`net/ipv6/conf/eth0/accept_dad`); dots are kept
//! as they are because interface names may contain them (`cni0.100`).
//! `/proc/sys/net` resolves in the netns of the calling *thread*, hence
//! the `*_in` variants that run on a netns thread.

use std::fs;
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};
use crate::netns::NetNs;

const PROC_SYS: &str = "/proc/sys";

/// Reads a sysctl of the calling thread's netns, without the trailing newline.
pub fn read(name: &str) -> Result<String> {
    let path = full_path(name)?;
    read_path(&path)
}

/// Sets a sysctl of the calling thread's netns, writing only if the value differs.
///
/// Reading first lets a read-only `/proc/sys` pass when the administrator
/// has already set the value.
pub fn write(name: &str, value: &str) -> Result<()> {
    let path = full_path(name)?;
    if let Ok(current) = read_path(&path) {
        if current == value {
            return Ok(());
        }
    }
    fs::write(&path, value).map_err(|source| Error::SysctlWrite {
        path,
        value: value.to_owned(),
        source,
    })
}

/// Reads a sysctl inside `netns`.
pub fn read_in(netns: &NetNs, name: &str) -> Result<String> {
    netns.run(|| read(name))?
}

/// Sets a sysctl inside `netns`, writing only if the value differs.
pub fn write_in(netns: &NetNs, name: &str, value: &str) -> Result<()> {
    netns.run(|| write(name, value))?
}

fn read_path(path: &Path) -> Result<String> {
    let text = fs::read_to_string(path).map_err(|source| Error::SysctlRead {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(text.trim_end_matches('\n').to_owned())
}

/// Maps a relative sysctl name to its file, refusing anything that could
/// leave `/proc/sys` (names are built from config-supplied interface names).
fn full_path(name: &str) -> Result<PathBuf> {
    let rel = Path::new(name);
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    if name.is_empty() || !plain {
        return Err(Error::InvalidSysctl {
            name: name.to_owned(),
        });
    }
    Ok(Path::new(PROC_SYS).join(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_below_proc_sys_verbatim() {
        assert_eq!(
            full_path("net/ipv4/conf/cni0.100/arp_notify").unwrap(),
            PathBuf::from("/proc/sys/net/ipv4/conf/cni0.100/arp_notify")
        );
    }

    #[test]
    fn names_that_escape_are_rejected() {
        for bad in ["", "/etc/passwd", "net/../../etc", "../x", "./net"] {
            assert!(
                matches!(full_path(bad), Err(Error::InvalidSysctl { .. })),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn reads_a_global_sysctl() {
        // Readable by anyone, present on every Linux kernel.
        let value = read("kernel/ostype").unwrap();
        assert_eq!(value, "Linux");
    }

    #[test]
    fn read_of_missing_sysctl_names_the_path() {
        let err = read("net/ipv4/conf/no-such-if0/arp_notify").unwrap_err();
        assert!(err.to_string().contains("no-such-if0"), "{err}");
    }
}

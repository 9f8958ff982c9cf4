//! Kernel parameters under `/proc/sys`. Names are slash-separated paths
//! relative to `/proc/sys` (`net/ipv6/conf/eth0/accept_dad`); dots are kept
//! as they are because interface names may contain them (`cni0.100`).
//! `/proc/sys/net` resolves in the netns of the calling *thread*, hence
//! the `*_in` variants that run on a netns thread.

use std::fs;
use std::io::Read;
use std::os::unix::fs::FileExt;
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
/// One open for both the read and the write: each lookup under `/proc/sys/net`
/// costs more the more network namespaces the node has. Where the file cannot be
/// opened for writing (a read-only `/proc/sys`, no privilege), it is read alone, so
/// that a value the administrator has already set passes.
pub fn write(name: &str, value: &str) -> Result<()> {
    let path = full_path(name)?;
    let failed = |path: PathBuf, source| Error::SysctlWrite {
        path,
        value: value.to_owned(),
        source,
    };
    match fs::OpenOptions::new().read(true).write(true).open(&path) {
        Ok(mut file) => {
            let mut current = String::new();
            // A failed read only means the value is written.
            if file.read_to_string(&mut current).is_ok() && current.trim_end_matches('\n') == value
            {
                return Ok(());
            }
            // At offset 0: the read moved the file position, and the kernel takes
            // a sysctl only from the start.
            file.write_all_at(value.as_bytes(), 0)
                .map_err(|source| failed(path, source))
        }
        Err(source) => match read_path(&path) {
            Ok(current) if current == value => Ok(()),
            _ => Err(failed(path, source)),
        },
    }
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

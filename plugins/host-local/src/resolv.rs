//! The `resolvConf` option: a resolv.conf-style file turned into the result's `dns`,
//! line by line as the reference's `parseResolvConf` does.

use crate::error::{Error, Result};
use cni_protocol::Dns;
use std::path::Path;

/// The most of a resolv.conf that is read (real ones are a few hundred bytes).
pub const MAX_RESOLV_CONF: u64 = 64 * 1024;

/// Reads and parses `path`. A missing or unreadable file fails ADD, as in the reference;
/// so does anything but a regular file (a device such as `/dev/zero` would be read for
/// ever, a FIFO would block: it is opened without blocking and checked first) and a file
/// larger than [`MAX_RESOLV_CONF`].
pub fn load(path: &Path) -> Result<Dns> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let failed = |source| Error::ResolvConf {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(failed)?;
    let meta = file.metadata().map_err(failed)?;
    if !meta.file_type().is_file() {
        return Err(failed(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    if meta.len() > MAX_RESOLV_CONF {
        return Err(failed(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} bytes; at most {MAX_RESOLV_CONF} are read", meta.len()),
        )));
    }
    let mut text = Vec::new();
    file.take(MAX_RESOLV_CONF)
        .read_to_end(&mut text)
        .map_err(failed)?;
    Ok(parse(&String::from_utf8_lossy(&text)))
}

/// Parses resolv.conf text: blank lines and `#`/`;` comments skipped; lines with fewer
/// than two fields skipped; `nameserver` takes its first argument, `domain` the last one
/// seen, `search` and `options` append all their arguments; other keywords are ignored.
pub fn parse(text: &str) -> Dns {
    let mut dns = Dns::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [keyword, first, rest @ ..] = fields.as_slice() else {
            continue;
        };
        let all = || {
            std::iter::once(*first)
                .chain(rest.iter().copied())
                .map(String::from)
        };
        match *keyword {
            "nameserver" => dns.nameservers.push((*first).to_string()),
            "domain" => dns.domain = (*first).to_string(),
            "search" => dns.search.extend(all()),
            "options" => dns.options.extend(all()),
            _ => {}
        }
    }
    dns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_the_reference() {
        let dns = parse(
            "# comment\n; other comment\n\nnameserver 10.0.0.1\nnameserver   fd00::53  extra\n\
             domain a.example\ndomain b.example\nsearch x.example y.example\nsearch z.example\n\
             options ndots:5 edns0\noptions\nsortlist 10.0.0.0\n  nameserver 10.0.0.2  \n",
        );
        assert_eq!(dns.nameservers, ["10.0.0.1", "fd00::53", "10.0.0.2"]);
        assert_eq!(dns.domain, "b.example");
        assert_eq!(dns.search, ["x.example", "y.example", "z.example"]);
        assert_eq!(dns.options, ["ndots:5", "edns0"]);
    }

    #[test]
    fn empty_and_missing() {
        assert!(parse("").is_empty());
        let err = load(Path::new("/nonexistent/resolv.conf")).unwrap_err();
        assert!(
            err.to_string().starts_with("/nonexistent/resolv.conf: "),
            "{err}"
        );
    }
}

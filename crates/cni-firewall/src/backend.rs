//! Which firewall tool carries a feature's rules: iptables or nftables. Masquerade
//! (`ipMasqBackend`) and host ports (`backend`) take the same two values and fall back
//! to the same default as the reference plugins.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::{iptables, nfnetlink};

/// Which firewall tool carries the rules (`ipMasqBackend`, portmap's `backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Per-container `CNI-…` chains in the `nat` table.
    Iptables,
    /// Rules in a table of their own (`inet cni_plugins_masquerade`, ...).
    Nftables,
}

impl FromStr for Backend {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "iptables" => Ok(Backend::Iptables),
            "nftables" => Ok(Backend::Nftables),
            other => Err(Error::UnknownBackend(other.to_owned())),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Iptables => "iptables",
            Backend::Nftables => "nftables",
        })
    }
}

impl Backend {
    /// The backend for an `ipMasqBackend` value: parsed when set, otherwise
    /// [`Backend::detect`].
    pub fn from_config(value: Option<&str>) -> Result<Backend> {
        value.map_or_else(|| Ok(Backend::detect()), str::parse)
    }

    /// The reference's default: iptables, unless only nftables works; when
    /// neither works (e.g. no privileges yet), nftables only if iptables is
    /// not installed but nft is.
    pub fn detect() -> Backend {
        let nft_installed = || crate::exec::locate("nft").is_some();
        choose_default(
            iptables::usable,
            // We no longer need the nft binary, but the reference does, and
            // the default must be the one it would pick.
            || nft_installed() && nfnetlink::usable(),
            iptables::installed,
            nft_installed,
        )
    }
}

/// The default-selection logic, with the probes passed in so it can be tested.
fn choose_default(
    ipt_usable: impl FnOnce() -> bool,
    nft_usable: impl FnOnce() -> bool,
    ipt_installed: impl FnOnce() -> bool,
    nft_installed: impl FnOnce() -> bool,
) -> Backend {
    if ipt_usable() {
        return Backend::Iptables;
    }
    if nft_usable() {
        return Backend::Nftables;
    }
    if !ipt_installed() && nft_installed() {
        return Backend::Nftables;
    }
    Backend::Iptables
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_backend_names() {
        assert_eq!("iptables".parse::<Backend>().unwrap(), Backend::Iptables);
        assert_eq!("nftables".parse::<Backend>().unwrap(), Backend::Nftables);
        let e = "NFTables".parse::<Backend>().unwrap_err();
        assert_eq!(e.to_string(), r#"unknown ipmasq backend "NFTables""#);
        let e = Backend::from_config(Some("")).unwrap_err();
        assert_eq!(e.to_string(), r#"unknown ipmasq backend """#);
        assert_eq!(Backend::Nftables.to_string(), "nftables");
    }

    #[test]
    fn default_selection_follows_reference() {
        let t = || true;
        let f = || false;
        assert_eq!(choose_default(t, t, t, t), Backend::Iptables);
        assert_eq!(choose_default(f, t, t, t), Backend::Nftables);
        assert_eq!(choose_default(f, f, f, t), Backend::Nftables);
        assert_eq!(choose_default(f, f, t, t), Backend::Iptables);
        assert_eq!(choose_default(f, f, f, f), Backend::Iptables);
    }
}

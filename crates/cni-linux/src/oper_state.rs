//! A link's operational state (`IF_OPER_*`), on its own so that the errors
//! ([`crate::error`]) can name it without depending on the netlink client that reads it.

use std::fmt;

/// Operational state of a link; prints like Go's `netlink.LinkOperState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperState {
    /// Unknown (e.g. `lo`, a bridge without ports).
    Unknown,
    /// Some component is missing.
    NotPresent,
    /// Down.
    Down,
    /// Down because the lower layer (e.g. veth peer) is down.
    LowerLayerDown,
    /// In test mode.
    Testing,
    /// Waiting for an external event.
    Dormant,
    /// Up and able to pass packets.
    Up,
    /// A value this crate does not know.
    Other(u8),
}

impl From<u8> for OperState {
    /// `IF_OPER_*` (linux/if.h).
    fn from(state: u8) -> Self {
        match state {
            0 => Self::Unknown,
            1 => Self::NotPresent,
            2 => Self::Down,
            3 => Self::LowerLayerDown,
            4 => Self::Testing,
            5 => Self::Dormant,
            6 => Self::Up,
            v => Self::Other(v),
        }
    }
}

impl fmt::Display for OperState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown => f.write_str("unknown"),
            Self::NotPresent => f.write_str("notpresent"),
            Self::Down => f.write_str("down"),
            Self::LowerLayerDown => f.write_str("lowerlayerdown"),
            Self::Testing => f.write_str("testing"),
            Self::Dormant => f.write_str("dormant"),
            Self::Up => f.write_str("up"),
            Self::Other(v) => write!(f, "unknown state ({v})"),
        }
    }
}

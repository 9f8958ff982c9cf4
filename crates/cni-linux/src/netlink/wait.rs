//! Waiting for the kernel to settle: a link reaching operational state up,
//! IPv6 addresses leaving the tentative state. The kernel offers no cheap
//! one-shot event for either, so both poll.

use std::time::{Duration, Instant};

use super::{Family, Netlink, OperState};
use crate::error::{Error, Result};
use crate::netlink::Link;

/// The schedule for polling a new port's oper state: about the reference's 2.5 s in
/// all, but in short steps first, since the kernel usually gets there within a tenth
/// of a millisecond and the reference's first 50 ms sleep is most of a pod's ADD time.
pub const OPER_UP_DELAYS: [Duration; 14] = [
    Duration::from_micros(0),
    Duration::from_micros(50),
    Duration::from_micros(100),
    Duration::from_micros(200),
    Duration::from_micros(400),
    Duration::from_micros(800),
    Duration::from_millis(2),
    Duration::from_millis(4),
    Duration::from_millis(8),
    Duration::from_millis(16),
    Duration::from_millis(64),
    Duration::from_millis(250),
    Duration::from_millis(1000),
    Duration::from_millis(1000),
];

/// First and longest pause between checks of tentative addresses: the kernel clears
/// the flag asynchronously just after link-up, so short pauses first, doubling up to
/// the reference's 50 ms interval.
const SETTLE_FIRST_INTERVAL: Duration = Duration::from_micros(100);
const SETTLE_MAX_INTERVAL: Duration = Duration::from_millis(50);

impl Netlink {
    /// Polls a link after each delay until it is oper-up; returns it, or `LinkNotUp`.
    pub fn wait_oper_up(&self, index: u32, delays: &[Duration]) -> Result<Link> {
        let mut last = None;
        for delay in delays {
            std::thread::sleep(*delay);
            let link = self.require_index(index)?;
            if link.oper_state == OperState::Up {
                return Ok(link);
            }
            last = Some(link);
        }
        let link = match last {
            Some(link) => link,
            None => self.require_index(index)?,
        };
        Err(Error::LinkNotUp {
            link: link.name,
            state: link.oper_state,
        })
    }

    /// Waits until no IPv6 address on the link is tentative.
    ///
    /// An address in DADFAILED state fails at once. If addresses are still
    /// tentative at the deadline this is an error only while the link is
    /// oper-up: without carrier DAD cannot run yet, and it finishes later.
    pub fn wait_addresses_settled(&self, index: u32, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut interval = SETTLE_FIRST_INTERVAL;
        loop {
            let addresses = self.addresses(index, Some(Family::V6))?;
            if let Some(failed) = addresses.iter().find(|a| a.is_dad_failed()) {
                let link = self.require_index(index)?;
                return Err(Error::AddressDadFailed {
                    link: link.name,
                    address: failed.ip.ip(),
                });
            }
            if !addresses.iter().any(|a| a.is_tentative()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let link = self.require_index(index)?;
                if link.oper_state != OperState::Up {
                    return Ok(());
                }
                return Err(Error::AddressesTentative {
                    link: link.name,
                    timeout,
                });
            }
            std::thread::sleep(interval);
            interval = (interval * 2).min(SETTLE_MAX_INTERVAL);
        }
    }

    fn require_index(&self, index: u32) -> Result<Link> {
        self.link_by_index(index)?
            .ok_or_else(|| Error::LinkNotFound {
                name: format!("#{index}"),
            })
    }
}

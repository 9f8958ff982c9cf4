//! Waiting for the kernel to settle: a link reaching operational state up,
//! IPv6 addresses leaving the tentative state. The kernel offers no cheap
//! one-shot event for either, so both poll.

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::{Family, Netlink, OperState};
use crate::error::{Error, Result};
use crate::netlink::Link;

/// The reference bridge plugin's schedule for polling a new port's oper state.
pub const OPER_UP_DELAYS: [Duration; 5] = [
    Duration::from_millis(0),
    Duration::from_millis(50),
    Duration::from_millis(500),
    Duration::from_millis(1000),
    Duration::from_millis(1000),
];

/// How often tentative addresses are re-checked (the reference's interval).
const SETTLE_INTERVAL: Duration = Duration::from_millis(50);

impl Netlink {
    /// Polls a link after each delay until it is oper-up; returns it, or `LinkNotUp`.
    pub async fn wait_oper_up(&self, index: u32, delays: &[Duration]) -> Result<Link> {
        let mut last = None;
        for delay in delays {
            sleep(*delay).await;
            let link = self.require_index(index).await?;
            if link.oper_state == OperState::Up {
                return Ok(link);
            }
            last = Some(link);
        }
        let link = match last {
            Some(link) => link,
            None => self.require_index(index).await?,
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
    pub async fn wait_addresses_settled(&self, index: u32, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let addresses = self.addresses(index, Some(Family::V6)).await?;
            if let Some(failed) = addresses.iter().find(|a| a.is_dad_failed()) {
                let link = self.require_index(index).await?;
                return Err(Error::AddressDadFailed {
                    link: link.name,
                    address: failed.ip.ip(),
                });
            }
            if !addresses.iter().any(|a| a.is_tentative()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let link = self.require_index(index).await?;
                if link.oper_state != OperState::Up {
                    return Ok(());
                }
                return Err(Error::AddressesTentative {
                    link: link.name,
                    timeout,
                });
            }
            sleep(SETTLE_INTERVAL).await;
        }
    }

    async fn require_index(&self, index: u32) -> Result<Link> {
        self.link_by_index(index)
            .await?
            .ok_or_else(|| Error::LinkNotFound {
                name: format!("#{index}"),
            })
    }
}

//! Sleeping until the container is stopped. A DaemonSet's main container must keep
//! running after the install, and the image (FROM scratch) has no shell or `sleep`.
//! As pid 1 of a container, a process gets no default action for SIGTERM: without
//! waiting for it explicitly, every pod deletion would wait out the grace period and
//! end in SIGKILL.

use nix::sys::signal::{SigSet, Signal};

/// SIGTERM and SIGINT, blocked: from now on they wait for [`Self::wait`] instead of
/// killing the process (block before announcing the sleep, or a quick signal kills).
#[derive(Debug)]
pub struct Termination(SigSet);

impl Termination {
    /// Blocks SIGTERM and SIGINT in the calling thread.
    pub fn block() -> nix::Result<Self> {
        let mut set = SigSet::empty();
        set.add(Signal::SIGTERM);
        set.add(Signal::SIGINT);
        set.thread_block()?;
        Ok(Self(set))
    }

    /// Waits for one of them; returns which arrived.
    pub fn wait(&self) -> nix::Result<Signal> {
        self.0.wait()
    }
}

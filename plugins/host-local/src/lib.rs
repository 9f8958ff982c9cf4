//! The `host-local` IPAM plugin: addresses from configured ranges, reserved as one file
//! per address under `<dataDir>/<network>/`, byte-compatible with the reference plugin.
//!
//! - [`config`]: keys, canonicalisation, validation (reference messages), `lockTimeout`.
//! - [`range`]: range and range-set math, the round-robin iterator.
//! - [`store`]: the directory: lock, reserve, release, scan, cursor files, GC.
//! - [`allocator`]: one address per range set, requested addresses, bounded search.
//! - [`reboot`]: reservations made before the current boot are released.
//! - [`resolv`]: `resolvConf` parsing.
//!
//! This file only wires the commands to them. ADD takes the network lock once for all
//! range sets (the reference locks per set), so a dual-stack ADD is atomic and the
//! directory is read once.

pub mod allocator;
pub mod config;
pub mod error;
pub mod range;
pub mod reboot;
pub mod resolv;
pub mod store;

use crate::allocator::Attachment;
use crate::config::IpamConfig;
use crate::error::Error;
use crate::store::Store;
use cni_protocol::{CniError, CniResult, Dns, Errors, Plugin, Request};

/// The plugin.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostLocal;

fn load(req: &Request) -> Result<IpamConfig, Error> {
    IpamConfig::load(&req.config, &req.args.args)
}

fn attachment(req: &Request) -> Attachment<'_> {
    Attachment {
        id: &req.args.container_id,
        ifname: &req.args.ifname,
    }
}

fn add(req: &Request) -> Result<CniResult, Error> {
    let config = load(req)?;
    let dns = match &config.resolv_conf {
        Some(path) => resolv::load(path)?,
        None => Dns::default(),
    };
    let store = Store::open(&config.data_dir, &config.name)?.for_command("add");
    let mut locked = store.lock(config.lock_timeout)?;
    locked.step("locked")?;
    if config.release_on_reboot {
        reboot::prepare(&mut locked, false)?;
    }
    let ips = allocator::allocate(
        &mut locked,
        &config.range_sets,
        &config.requested,
        attachment(req),
    )?;
    Ok(CniResult {
        cni_version: req.config.cni_version.clone(),
        interfaces: Vec::new(),
        ips,
        routes: config.routes,
        dns,
    })
}

/// DEL releases by owner, never needs the netns, and succeeds when nothing is left.
/// With a prevResult listing our addresses, those files are checked and removed
/// directly; the whole directory is read only when that did not account for one
/// address per range set (no prevResult, a changed config, a repeated DEL).
fn del(req: &Request) -> Result<(), Error> {
    let config = load(req)?;
    let store = Store::open(&config.data_dir, &config.name)?.for_command("del");
    let locked = store.lock(config.lock_timeout)?;
    locked.step("locked")?;
    let who = attachment(req);
    let mut released = 0;
    let mut errors = Errors::default();
    if let Some(prev) = &req.config.prev_result {
        for ip in &prev.ips {
            match locked.release_if_owned(range::canonical_ip(ip.address.ip()), who.id, who.ifname)
            {
                Ok(true) => released += 1,
                Ok(false) => {}
                Err(e) => errors.push(e),
            }
        }
    }
    if released < config.range_sets.len()
        && let Err(e) = locked.release_by_owner(who.id, who.ifname)
    {
        errors.push(e);
    }
    errors.into_result_all(Error::Many)
}

fn check(req: &Request) -> Result<(), Error> {
    let config = load(req)?;
    let store = Store::open(&config.data_dir, &config.name)?;
    let locked = store.lock(config.lock_timeout)?;
    if locked.owns_any(&req.args.container_id, &req.args.ifname)? {
        Ok(())
    } else {
        Err(Error::NotFound(req.args.container_id.clone()))
    }
}

/// STATUS: ADD can be served unless the state directory cannot be written or a range set
/// (ADD needs one address from each) is full. Reads without the lock: it is advice.
fn status(req: &Request) -> Result<(), Error> {
    let config = load(req)?;
    let unavailable = |e: Error| Error::Unavailable(Box::new(e));
    let store = Store::open(&config.data_dir, &config.name)
        .map_err(unavailable)?
        .for_command("status");
    store.probe_writable().map_err(unavailable)?;
    let mut entries = store.scan(false).map_err(unavailable)?;
    if let Some(boot) = reboot::current_boot_id().filter(|_| config.release_on_reboot) {
        let stale = reboot::stale_names(&store, &entries, &boot);
        entries.retain(|e| !stale.contains(&e.name));
    }
    match allocator::first_exhausted(&config.range_sets, &entries) {
        Some(set) => Err(unavailable(Error::Exhausted(set.to_string()))),
        None => Ok(()),
    }
}

fn gc(req: &Request) -> Result<(), Error> {
    let config = load(req)?;
    let valid = req.config.valid_attachments().map_err(Error::Args)?;
    let store = Store::open(&config.data_dir, &config.name)?.for_command("gc");
    let mut locked = store.lock(config.lock_timeout)?;
    locked.step("locked")?;
    if config.release_on_reboot {
        reboot::prepare(&mut locked, true)?;
    }
    locked.gc(&valid).map(|_| ())
}

impl Plugin for HostLocal {
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        add(req).map_err(CniError::from)
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        del(req).map_err(CniError::from)
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        check(req).map_err(CniError::from)
    }

    fn status(&self, req: &Request) -> Result<(), CniError> {
        status(req).map_err(CniError::from)
    }

    fn gc(&self, req: &Request) -> Result<(), CniError> {
        gc(req).map_err(CniError::from)
    }
}

//! The GID a port's connections use, cached once per port and shared by every comm on it, and
//! selected again after the port's GID table changed (`IBV_EVENT_GID_CHANGE`, counted per port
//! by the context's event thread): new connections and recoveries then use the new pick, while
//! QPs already connected keep theirs. [`NetDevice::gid_now`](super::NetDevice::gid_now) is the
//! one reader.

use crate::error::{Error, Result};
use crate::ibv::Context;
use parking_lot::Mutex;
use std::net::Ipv6Addr;
use std::sync::atomic::Ordering;

/// A port's GID pick and the count of GID-change events it was made after.
pub struct GidCache(Mutex<Cached>);

struct Cached {
    changes: u32,
    index: i32,
    gid: [u8; 16],
}

/// `IBV_EVENT_GID_CHANGE`s seen so far on port `port` of `ctx`.
pub(super) fn changes(ctx: &Context, port: u8) -> u32 {
    ctx.gid_changes
        .get(usize::from(port))
        .map_or(0, |c| c.load(Ordering::Acquire))
}

impl GidCache {
    /// The pick made at discovery, after `changes` GID-change events of the port.
    pub(super) fn new(changes: u32, index: i32, gid: [u8; 16]) -> GidCache {
        GidCache(Mutex::new(Cached { changes, index, gid }))
    }

    /// The cached pick while the port has seen `changes` GID changes, else `pick()` made again
    /// and cached (an INFO line for `label` when it moved). `Err` — the cache unchanged, so the
    /// next call picks again — when `pick` finds no usable GID.
    pub(super) fn get(
        &self,
        changes: u32,
        label: &str,
        pick: impl FnOnce() -> std::result::Result<(i32, [u8; 16]), String>,
    ) -> Result<(i32, [u8; 16])> {
        let mut c = self.0.lock();
        if c.changes == changes {
            return Ok((c.index, c.gid));
        }
        let (index, gid) = pick().map_err(|why| Error::system(format!("{label}: the GID table changed and {why}")))?;
        if (index, gid) != (c.index, c.gid) {
            crate::log_info!(
                crate::log::subsys::NET | crate::log::subsys::INIT,
                "{label}: the GID table changed: new connections use GID[{index}] {} (was GID[{}] {})",
                Ipv6Addr::from(gid),
                c.index,
                Ipv6Addr::from(c.gid)
            );
        }
        *c = Cached { changes, index, gid };
        Ok((index, gid))
    }
}
